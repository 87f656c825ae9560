"""Write `inventory.sim.yaml`: the sim cluster in the same shape as any inventory (see sparkdeploy.model.inventory)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import yaml

ROUTER_PORT = 8080

HEADER = ("# written by `sparkdeploy sim up` (cluster {name!r}, {when}); `sparkdeploy sim down` removes it.\n"
          "# Every command accepts it: --inventory {path}\n")


def home_relative(path: str) -> str:
    """`~/...` for a path under the user's home (as people write inventories), else the path as given."""
    try:
        return "~/" + Path(path).relative_to(Path.home()).as_posix()
    except ValueError:
        return path


def ssh_block(state, node) -> dict:
    return {"host": node.ip, "user": state.user, "port": 22, "key": home_relative(state.key),
            "known_hosts": home_relative(state.known_hosts)}


def api_key_path(ssh_key: str | Path, cluster: str) -> Path:
    """The sim cluster's API key, beside its SSH key (0600): the demo serves behind a key as users should."""
    return Path(ssh_key).with_name(f"sparkdeploy-sim-{cluster}_api_key")


def write_api_key(path: Path) -> Path:
    """A random key, written once (0600 from the start) and kept across `sim up` runs."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    return path


def _world_size(profile: str) -> int:
    """The profile's nodes per replica (0 when it cannot be read: the loader then says why, in _validate)."""
    from sparkdeploy.errors import InventoryError
    from sparkdeploy.model.profile import find_profile, load_profile

    path = find_profile(profile, Path.cwd() / "inventory.sim.yaml")
    try:
        return load_profile(path, name=path.stem)[0].world_size
    except (InventoryError, OSError):
        return 0


def data_plane(node) -> dict:
    """A node's data links as the inventory writes them: `links:` from a ring's networks (the netdev the node
    saw each address on, the peer at the other end), else the one-link shorthand on the management network."""
    if not node.links:
        return {"data_ip": node.ip, "netdev": "eth0", "hca": []}
    return {"links": [{"netdev": link.netdev, "ip": link.ip, "prefix": link.prefix, "peer": link.peer}
                      for link in node.links]}


def service_groups(state, per: int) -> list[list[str]]:
    """The nodes of each service: consecutive groups of the profile's `per` nodes. On a ring every full group
    (three nodes at TP=2: node1 + node2, node3 idle: neighbours share a cable); otherwise only where the nodes
    divide evenly and there is more than one group (else the inventory is one service without `services:`)."""
    names = [n.name for n in state.nodes]
    if per <= 0:
        return []
    ring = any(n.links for n in state.nodes)
    if not ring and not (len(names) > per and len(names) % per == 0):
        return []
    return [names[i:i + per] for i in range(0, len(names) - per + 1, per)]


def inventory_dict(state, vocab: Path | None = None, base_image_id: str | None = None,
                   api_key: Path | None = None) -> dict:
    """The inventory mapping for a sim cluster's state (nodes, SSH login and key, known_hosts, the sim profile).
    More nodes than the profile's tp x pp x dp (e.g. four for a TP=2 profile), or a ring: one service per group
    of that many nodes, `s1` on node1 + node2, `s2` on node3 + node4 and so on, each behind its own API on its
    head (and a router on node1 where there are several)."""
    groups = service_groups(state, _world_size(state.profile))
    nodes = []
    for node in state.nodes:
        nodes.append({
            "name": node.name,
            **({} if groups else {"role": node.role}),
            "ssh": ssh_block(state, node),
            **data_plane(node),
            "gpu": "none",
        })
    service = {
        "profile": state.profile,
        # fp8_gdn stays off: the CPU build has no FP8 GEMM for it
        "patches": {"shortlist": vocab is not None, "skinny_gemm": True, "fp8_gdn": False, "prefix_align": True},
        **({"vocab": str(vocab)} if vocab is not None else {}),
        "ports": {"api": 8000, "master": 29500},
        "memory": {"reserve_gib": 4},  # a sim node shares the host's RAM; the CPU engine needs ~3 GB per rank
    }
    image = {"repository": "sparkdeploy/serving-sim"}  # base, vLLM version, python, pip: from the profile
    if base_image_id:
        # Pinned by content: a rebuilt engine base gives a new serving-image tag instead of a stale image.
        image["base"] = base_image_id
    data: dict = {"cluster": f"sim-{state.name}", "nodes": nodes, "image": image}
    if groups:  # each service its own model name, behind one router on the first node
        data["services"] = [{"name": f"s{i + 1}", "nodes": group, "served_name": f"tiny-s{i + 1}", **service}
                            for i, group in enumerate(groups)]
        if api_key is not None and len(groups) > 1:
            data["router"] = {"node": state.nodes[0].name, "port": ROUTER_PORT}
    else:
        data = {"cluster": data["cluster"], "profile": service.pop("profile"), "nodes": nodes, "image": image,
                **service}
    if api_key is not None:
        data["auth"] = {"api_key_file": home_relative(str(api_key))}
    return data


def write_stand_in_vocab(path: Path, size: int = 1024) -> Path:
    """A stand-in draft list for the tiny models' 4096-token tokenizer: every id below `size`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i}\n" for i in range(size)))
    return path


class _PlainDumper(yaml.SafeDumper):
    """Each service's blocks written out in full (not as &id001 / *id001 anchors), as a person would."""

    def ignore_aliases(self, data) -> bool:
        return True


def write_inventory(state, path: Path, base_image_id: str | None = None, *, vocab_dir: Path | None = None) -> str | None:
    """Write the file (the stand-in vocab into `vocab_dir`, default beside it); return why the inventory loader
    rejects it (e.g. node count vs profile), or None."""
    vocab = write_stand_in_vocab((vocab_dir or path.parent) / "vocab-tiny-1k.txt")
    data = inventory_dict(state, vocab, base_image_id, write_api_key(api_key_path(state.key, state.name)))
    text = HEADER.format(name=state.name, when=time.strftime("%Y-%m-%d %H:%M:%S"), path=path)
    text += yaml.dump(data, Dumper=_PlainDumper, sort_keys=False, default_flow_style=None, width=120)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return _validate(path, len(state.nodes))


def _validate(path: Path, nodes: int) -> str | None:
    """Load it back with the real inventory loader, so a sim inventory that other commands reject fails here."""
    try:
        from sparkdeploy.model import inventory
    except ImportError:  # pragma: no cover - the spine is part of the package
        return None
    from sparkdeploy.errors import InventoryError

    try:
        inventory.load_services(path)
    except InventoryError as err:
        return (f"the inventory does not validate for deployment ({err}); with {nodes} node(s) pick a profile whose "
                "tp x pp x dp matches (--profile)")
    return None
