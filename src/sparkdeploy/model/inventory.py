"""Load and validate `inventory.yaml` (and the model profile it names) into immutable, typed objects.

The file's shape (each key's type, range, pattern and default) is declared once, in `model/schema.py`; this
module reads the file against it and checks what spans keys (one head, unique addresses, links or the shorthand,
ports across services, the profile and list a service names). Every error is an `InventoryError` naming the
file, the field path (`nodes[1].data_ip`) and what was expected. Unknown keys are errors: a typo must never pass
silently. Values that later reach shell or unit text are checked (no control characters anywhere; strict
patterns for names, interfaces, hosts, image refs) and are *also* quoted by the renderer, so validation is a
second wall, not the only one.

Inventory shape (see the top-level `inventory.yaml` and `tests/unit/fixtures/inventory.sim.yaml`):

    cluster: spark-pair                 # name, used in unit descriptions and labels
    profile: qwen3.8-flash-next-nvfp4   # deploy/profiles/<name>.yaml, or a path relative to this file
    nodes:                              # exactly one head; GB10s have one GPU, so one rank per node
      - name: spark1
        role: head                      # head | worker
        ssh: {host: 10.0.0.11, user: nvidia, port: 22, key: ~/.ssh/id_ed25519, known_hosts: ~/.ssh/known_hosts}
        data_ip: 192.168.177.11         # this node's CX-7 (data-plane) IPv4
        netdev: enp1s0f1np1             # the netdev carrying data_ip
        hca: [rocep1s0f1, roceP2p1s0f1] # RoCE devices (both twins), [] for none
        gpu: gb10                       # gb10 | none (simulated nodes)
      - name: spark2                    # several data links (a 3-node ring: two cables, two peers, two subnets)
        links:                          # instead of data_ip/netdev/hca, never both
          - {netdev: enp1s0f0np0, ip: 192.168.10.2, prefix: 24, hca: [rocep1s0f0], peer: spark1}
          - {netdev: enp1s0f1np1, ip: 192.168.12.2, hca: [rocep1s0f1], peer: spark3}   # prefix: 24 by default
    image:      {base: REF@sha256:..., vllm_version: 0.34.0, local: false, repository: sparkdeploy/serving}
    patches:    {shortlist: true, skinny_gemm: true, fp8_gdn: true, prefix_align: true}
    vocab:      vocabs/x.txt            # draft vocab list, relative to this file; null only if shortlist is off
    ports:      {api: 8000, master: 29501, metrics: 9466}   # metrics: the head's exporter, 0 = none
    memory:     {reserve_gib: 28, gpu_memory_utilization: null}   # see plan/memory.py
    watchdog:   {wedge_util_pct: 90, wedge_power_w: 30, wedge_for_s: 120}   # busy at low power = wedged
    sentinel:   {categories: [code, prose_en], tokens: 32, runs: 3, warmup: 1}  # the speed check after a gate
    speculative_tokens: 2               # optional override of the profile's MTP depth (0 = off)
    served_name: chat                   # optional: the model name requests ask for (default: the profile's)

Several services (`examples/inventory.4node.yaml`): the nodes once, without `role`, then `services:`, each entry
with `name`, `nodes` (names, its head first) and the per-service keys above (profile, image, patches, vocab, ports,
memory, watchdog, sentinel, speculative_tokens, served_name; `image` merges over the top-level one). Each service
loads as its own `Inventory`; services may share a node (own names there, an equal part of its memory, their own
ports).
`router: {node: spark1, port: 8080}` puts vLLM's router on that node:
one OpenAI endpoint that sends each request to the service serving its `model` (steps/router.py).
`replicas: N` in a service makes N copies of it, each on its own group of its `nodes` (listed group after group,
each group's head first): `NAME/1` .. `NAME/N` to `--service`, one view each, the same names on their nodes. The
router balances the model across them; `up` and `rollback` move one copy at a time, taken out of the router's
rotation while it restarts (steps/deploy.py), so the model keeps answering.

Links. A node's data links are `links:` or the one-link shorthand (data_ip, netdev, hca: prefix 24). Each service
uses one link per node, the one on the subnet all its nodes share (`topology.group_links`): its view of a node has
that link's address, netdev and HCAs as `data_ip`, `netdev` and `hca`, so everything that reaches NCCL, Gloo and
the master address comes from the link the node actually uses. Outside a service (`elsewhere`, the router's node)
a node shows its first link.

The profile's `image:` block gives defaults (python, pip, and for the simulated profiles the base too) that
the inventory's `image:` overrides key by key.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

from sparkdeploy import paths, yamlfile
from sparkdeploy.errors import InventoryError, RemoteError
from sparkdeploy.model import credentials, engine_args, sshconfig, topology
from sparkdeploy.model.credentials import Auth
from sparkdeploy.model.fields import at, read, short
from sparkdeploy.model.profile import (
    ImageConfig,
    Profile,
    Speculative,
    find_profile,
    image_config,
    image_part,
    load_profile,
)
from sparkdeploy.model.schema import (  # the sections of the file are the inventory's types too
    AuthFiles,
    InventoryFile,
    LinkEntry,
    MemoryConfig,
    NodeEntry,
    Patches,
    Ports,
    SentinelConfig,
    ServiceKeys,
    WatchdogConfig,
)
from sparkdeploy.model.topology import DEFAULT_PREFIX, Link
from sparkdeploy.node.layout import ServiceLayout

ROLES = ("head", "worker")


# ------------------------------------------------------------------------------------------------ types
@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str = "root"
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None  # from ~/.ssh/config


@dataclass(frozen=True)
class Node:
    name: str
    role: str  # "head" | "worker"
    ssh: SshTarget
    data_ip: str  # these three: the link this view uses (a service's: the one its group shares; else the first)
    netdev: str
    hca: tuple[str, ...]
    gpu: str  # "gb10" | "none"
    links: tuple[Link, ...] = ()  # every data link of the node (the shorthand: one); () for a bare test node

    @property
    def has_gpu(self) -> bool:
        return self.gpu != "none"

    def data_links(self) -> tuple[Link, ...]:
        return self.links or (Link(self.netdev, self.data_ip, DEFAULT_PREFIX, self.hca),)

    def using(self, link: Link) -> "Node":
        """This node as a group that talks over `link` sees it."""
        return _replace(self, data_ip=link.ip, netdev=link.netdev, hca=link.hca)


@dataclass(frozen=True)
class Vocab:
    path: Path  # absolute host path of the source list (stored on every node, bind-mounted read-only into the engine)
    sha256: str
    size: int  # number of ids


@dataclass(frozen=True)
class RouterConfig:
    """`router:` (with `services:`): vLLM's router on `node`, one OpenAI endpoint for every service's model."""
    node: Node
    port: int = 8080


@dataclass(frozen=True)
class Inventory:
    file: str
    cluster: str
    nodes: tuple[Node, ...]
    profile: Profile
    image: ImageConfig
    patches: Patches
    vocab: Vocab | None
    ports: Ports
    memory: MemoryConfig
    auth: Auth = Auth()
    watchdog: WatchdogConfig = WatchdogConfig()
    sentinel: SentinelConfig = SentinelConfig()
    service: str | None = None  # its name in `services:`; None: the inventory is one service (no `services:`)
    router: RouterConfig | None = None  # the same on every service's view
    backend: str = "mp"  # how the ranks of a multi-node service meet: vLLM's own (mp) or a Ray cluster (ray)
    services: tuple[str, ...] = ()  # every service of the inventory (`services:`), this one included
    tenants: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (node, the services on it) where several share one
    elsewhere: tuple[Node, ...] = ()  # the inventory's nodes outside this service: `up` retires its units there
    replica: int = 0  # which copy of a service with `replicas: N` (1..N) this view is; 0: the service has one

    @property
    def key(self) -> str | None:
        """How commands name this view (`--service`): the service's name, `NAME/R` for its replica R."""
        return f"{self.service}/{self.replica}" if self.replica else self.service

    def shared_by(self, node: str) -> int:
        """How many services of the inventory run on `node` (its memory is split between them)."""
        return len(dict(self.tenants).get(node, ())) or 1

    def our_units(self) -> list[str]:
        """The units of every service of the inventory: on a node they share, none is another's stale unit."""
        lays = [ServiceLayout(name) for name in self.services] or [self.layout]
        return [u for lay in lays for u in (lay.unit, lay.watchdog_service, lay.exporter_unit)]

    @property
    def layout(self) -> ServiceLayout:
        """Its names and paths on a node (per service with `services:`, so services can share a node)."""
        return ServiceLayout(self.service)

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


# ------------------------------------------------------------------------------------------- sections
class _Where:
    """Where a part of the file is (`nodes[1]`, `services[0]`, "" for the top level), for errors found across keys."""

    def __init__(self, file: str, path: str = ""):
        self.file, self.path = file, path

    def fail(self, key: str, message: str) -> NoReturn:
        raise InventoryError(message, file=self.file, field=at(self.path, key))

    def under(self, key: str) -> "_Where":
        return _Where(self.file, at(self.path, key))


def _node(entry: NodeEntry, where: _Where, *, in_services: bool) -> Node:
    """One entry of `nodes:`. With `services:` a node has no role of its own: each service's first node is
    its head (role is given to the service's view of the node)."""
    if in_services:
        if entry.role is not None:
            where.fail("role", "with services:, each service's first node is its head; remove role")
        role = "worker"
    elif entry.role is None:
        where.fail("role", "missing; expected head or worker")
    elif entry.role not in ROLES:
        where.fail("role", f"{entry.role!r} is not head or worker")
    else:
        role = entry.role
    # As on the ssh command line: the inventory's values win, then ~/.ssh/config's for the host (a Host alias
    # resolves to its HostName, which the head's watchdog needs too), then root on port 22. Key paths stay as
    # written (`~/.ssh/...`: plans do not depend on who runs the kit); remote expands `~` and `$VAR` at connect.
    s = entry.ssh
    try:
        cfg = sshconfig.ssh_config(s.host)
        cfg_port = int(cfg.get("port", 22))
    except (RemoteError, ValueError) as err:
        where.fail("ssh.host", f"~/.ssh/config for {s.host!r}: {err}")
    ssh = SshTarget(host=cfg["hostname"], user=s.user or cfg.get("user") or "root", port=s.port or cfg_port,
                    key=s.key or sshconfig.identity_of(cfg), known_hosts=s.known_hosts, proxy_jump=cfg.get("proxyjump"))
    shorthand = [key for key in _LINK_SHORTHAND if getattr(entry, key) is not None]
    if entry.links is not None:
        if shorthand:
            where.fail(shorthand[0], "give links: or the one-link shorthand (data_ip, netdev, hca), not both; move "
                                     f"{', '.join(shorthand)} into an entry of links:")
        if not entry.links:
            where.fail("links", "must list at least one data link ({netdev, ip, prefix, hca, peer})")
        links = tuple(_link(e) for e in entry.links)
        _check_own_links(where, entry.name, links)
    elif entry.data_ip is None:
        where.fail("data_ip", "missing; give the node's data link as data_ip, netdev and hca, or its links as "
                              "links: [{netdev, ip, prefix, hca, peer}, ...]")
    elif entry.netdev is None:
        where.fail("netdev", "missing; expected a network interface name (1-15 of letters, digits, '.', '_', '-')")
    else:
        links = (Link(netdev=entry.netdev, ip=entry.data_ip, prefix=DEFAULT_PREFIX, hca=entry.hca or ()),)
    first = links[0]
    return Node(name=entry.name, role=role, ssh=ssh, data_ip=first.ip, netdev=first.netdev, hca=first.hca,
                gpu=entry.gpu, links=links)


def _link(entry: LinkEntry) -> Link:
    return Link(netdev=entry.netdev, ip=entry.ip, prefix=entry.prefix, hca=entry.hca, peer=entry.peer)


def _check_own_links(where: _Where, node: str, links: tuple[Link, ...]) -> None:
    """A node's links are distinct ports: each netdev, and each subnet, once (two links on one subnet would leave
    the choice of port to the routing table, not to the plan)."""
    for i, link in enumerate(links):
        for j, other in enumerate(links[:i]):
            if link.netdev == other.netdev:
                where.fail(f"links[{i}].netdev", f"{link.netdev!r} is also links[{j}] of node {node}: one entry per "
                                                 "port")
            if link.subnet == other.subnet:
                where.fail(f"links[{i}].ip", f"{link.describe()} is on {link.subnet}, like links[{j}] "
                                             f"({other.describe()}): each link of a node is its own subnet")
        if link.peer == node:
            where.fail(f"links[{i}].peer", f"{node!r} is this node; peer names the node at the link's other end")


# ------------------------------------------------------------------------------------------------ load
_LINK_SHORTHAND = ("data_ip", "netdev", "hca")


def _auth(files: AuthFiles, inventory_file: Path) -> Auth:
    """Secret files are local paths (`~`, `$VAR` expanded, relative to the inventory), read now so a bad one exits 2."""
    found: dict[str, Path] = {}
    for key in ("api_key_file", "hf_token_file"):
        ref = getattr(files, key)
        if ref is None:
            continue
        path = Path(sshconfig.local_path(ref))
        path = path if path.is_absolute() else inventory_file.parent / path
        try:
            credentials.read_secret(path, f"auth.{key}")
        except InventoryError as err:
            raise InventoryError(err.reason, file=str(inventory_file), field=f"auth.{key}") from None
        found[key] = path
    return Auth(**found)


def _vocab(ref: str | None, where: _Where, inventory_file: Path, required: bool, vocab_size: int | None) -> Vocab | None:
    """The draft list, read by the one reader the engine uses (spark_overlays.vocab_list: format, bounds,
    sorted, unique) and checked against the served tokenizer's vocabulary size when it is recorded."""
    from spark_overlays import vocab_list

    if ref is None:
        if required:
            where.fail("vocab", "missing; patches.shortlist is on, so a draft vocab list (one id per line) is needed")
        return None
    path = Path(sshconfig.local_path(ref))
    if not path.is_absolute():
        path = inventory_file.parent / path
    try:
        data = vocab_list.read_bytes(path)
        ids = vocab_list.parse_text(data, str(path), vocab_size)
    except vocab_list.VocabListError as err:
        where.fail("vocab", str(err))
    if not ids.size:
        where.fail("vocab", f"{path} holds no token ids")
    return Vocab(path=path.resolve(), sha256=hashlib.sha256(data).hexdigest(), size=int(ids.size))


def load(path: str | Path, service: str | None = None) -> Inventory:
    """Read, validate and type an inventory and its profile(s); raise InventoryError naming file and field.
    Returns one service: `service` by name, or the only one (an inventory without `services:` is one)."""
    return select(load_services(path), service, path)


def select(views: tuple[Inventory, ...], service: str | None, path: str | Path) -> Inventory:
    """One of the inventory's views (`load_services`), as `load` picks it."""
    names = [v.key for v in views]
    if service is None:
        if len(views) == 1:
            return views[0]
        raise InventoryError(f"{len(views)} services ({', '.join(map(str, names))}): choose one with --service NAME",
                             file=str(path), field="services")
    for view in views:
        if view.key == service or (view.service is None and service == view.cluster):
            return view
    replicas = [v.key for v in views if v.service == service]
    if replicas:
        raise InventoryError(f"service {service} has {len(replicas)} replicas ({', '.join(map(str, replicas))}): "
                             "this command acts on one; name it with --service NAME/R", file=str(path),
                             field="services")
    raise InventoryError(f"no service {service!r}; the inventory has " +
                         (f"services {', '.join(map(str, names))}" if views[0].service else
                          f"one service, named after its cluster ({views[0].cluster!r})"),
                         file=str(path), field="services")


def load_services(path: str | Path) -> tuple[Inventory, ...]:
    """Every service of the inventory as its own `Inventory` (its nodes, the first its head; its profile, ports,
    list, memory), placement checked across them: each service's nodes exist, once each, and services that share a node use
    different ports there. A service with `replicas: N` is N views, one per group of its nodes (in the order
    listed, each group's first node its head), all under its name."""
    inventory_file = Path(path)
    file = str(inventory_file)
    raw = yamlfile.load(inventory_file, "inventory")
    top = _Where(file)
    if isinstance(raw, dict) and raw.get("services") is not None:  # before the shape: these name the fix
        for key in (f.name for f in dataclasses.fields(ServiceKeys)):
            if key not in ("image",) and key in raw:
                top.fail(key, f"with services:, {key} belongs to each service (services[N].{key})")
    f = read(InventoryFile, raw, "", file)
    in_services = f.services is not None
    if not f.nodes:
        top.fail("nodes", "must list at least one node")
    nodes = tuple(_node(entry, top.under(f"nodes[{i}]"), in_services=in_services) for i, entry in enumerate(f.nodes))
    _check_unique(nodes, [entry.links is not None for entry in f.nodes], file)
    auth = _auth(f.auth, inventory_file)
    index = {n.name: i for i, n in enumerate(nodes)}
    shared_image = image_part(f.image, file, "image")
    if not in_services:
        if f.router is not None:
            top.fail("router", "a router fronts several services; it needs `services:` (one service is its own endpoint)")
        heads = [i for i, n in enumerate(nodes) if n.role == "head"]
        if len(heads) != 1:
            where = "nodes" if not heads else f"nodes[{heads[1]}].role"
            raise InventoryError(f"exactly one node must have role: head, found {len(heads)}", file=file, field=where)
        return (_service(f, top, f.cluster, nodes, inventory_file, auth, shared_image, index),)

    if not f.services:
        top.fail("services", "must list at least one service")
    views: list[Inventory] = []
    for si, entry in enumerate(f.services):
        s = top.under(f"services[{si}]")
        if any(v.service == entry.name for v in views):
            s.fail("name", f"{entry.name!r} names two services")
        listed = entry.nodes
        if not listed:
            s.fail("nodes", "must list at least one node, its head first")
        replicas = entry.replicas
        if len(listed) % replicas:
            s.fail("nodes", f"{len(listed)} nodes do not split into {replicas} replicas of one size: list "
                            f"{replicas} groups of equal size, each group's head first")
        size = len(listed) // replicas
        members: list[Node] = []
        for ni, node_name in enumerate(listed):
            if not isinstance(node_name, str) or node_name not in index:
                s.fail(f"nodes[{ni}]", f"no node named {short(node_name)} in nodes: ({', '.join(index)})")
            if any(m.name == node_name for m in members):
                s.fail(f"nodes[{ni}]", f"node {node_name!r} is twice in this service: one rank per node")
            members.append(_replace(nodes[index[node_name]], role="head" if ni % size == 0 else "worker"))
        image = {**shared_image, **image_part(entry.image, file, f"{s.path}.image")}  # the service's keys win
        for r in range(replicas):
            view = _service(entry, s, f"{f.cluster}.{entry.name}", tuple(members[r * size:(r + 1) * size]),
                            inventory_file, auth, image, index, service=entry.name)
            views.append(_replace(view, replica=r + 1 if replicas > 1 else 0))
    names = tuple(dict.fromkeys(str(v.service) for v in views))
    tenants = _tenants(top, nodes, views, names)
    router = _router(f, top, nodes, views, names)

    def outside(v: Inventory) -> tuple[Node, ...]:
        """The nodes no copy of v's service runs on (another replica's nodes run the same units)."""
        mine = {n.name for w in views if w.service == v.service for n in w.nodes}
        return tuple(n for n in nodes if n.name not in mine)

    return tuple(_replace(v, router=router, services=names, tenants=tenants, elsewhere=outside(v)) for v in views)


def _tenants(top: _Where, nodes: tuple[Node, ...], views: list[Inventory],
             names: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The nodes several services share, with those services. Each service has its own names there
    (`layout.ServiceLayout`) and an equal part of the memory (`memory.budget`). A service binds its ports on its
    head only (the API, the exporter, the rendezvous or Ray's head), so services whose heads share a node must
    use different ones."""
    tenants = []
    for node in nodes:
        on = [(names.index(str(v.service)), v) for v in views if any(n.name == node.name for n in v.nodes)]
        taken: dict[int, str] = {}  # port -> "service s1's ports.api"
        for si, v in on:
            if v.head.name != node.name:
                continue
            for key in ("api", "master", "metrics"):
                port = getattr(v.ports, key)
                if not port:
                    continue
                if port in taken:
                    top.fail(f"services[{si}].ports.{key}", f"{port} is already {taken[port]} on node {node.name}, "
                             "the head of both: give services whose heads share a node their own ports")
                taken[port] = f"service {v.service}'s ports.{key}"
        if len(on) > 1:
            tenants.append((node.name, tuple(v.service for _, v in on)))
    return tuple(tenants)


def _router(f: InventoryFile, top: _Where, nodes: tuple[Node, ...], views: list[Inventory],
            names: tuple[str, ...]) -> RouterConfig | None:
    """`router: {node, port}`: on a listed node, its port free of that node's service ports, and behind the API
    key (its admin API, which adds and removes workers, is otherwise open to whoever reaches the port)."""
    if f.router is None:
        return None
    r, name, port = top.under("router"), f.router.node, f.router.port
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        r.fail("node", f"no node named {short(name)} in nodes: ({', '.join(n.name for n in nodes)})")
    by_name: dict[str, Inventory] = {}
    for v in views:
        si = names.index(str(v.service))
        other = by_name.setdefault(v.profile.served_name, v)
        if other.profile.name != v.profile.name:
            top.fail(f"services[{si}].served_name", f"{v.profile.served_name!r} is also service {other.service}'s "
                     "model name, with another profile: the router sends a model's requests to every service serving "
                     "that name, so give each model its own (services[].served_name)")
    for v in views:
        if any(n.name == name for n in v.nodes) and port in (v.ports.api, v.ports.master, v.ports.metrics):
            r.fail("port", f"{port} is already service {v.service}'s port on {name} (services[].ports)")
    if views[0].auth.api_key_file is None:
        top.fail("router", "the router needs auth.api_key_file: its admin API adds and removes workers, so it only "
                           "answers requests that carry the services' API key")
    return RouterConfig(node=node, port=port)


def _service(f: ServiceKeys, where: _Where, cluster: str, nodes: tuple[Node, ...], inventory_file: Path, auth: Auth,
             image_set: dict[str, Any], index: dict[str, int], service: str | None = None) -> Inventory:
    """What one service is: profile, patches, MTP depth, image, ports, memory and draft list from `f` (the top
    level, or one entry of `services:`), checked against the nodes it runs on."""
    file = str(inventory_file)
    if f.profile is None:
        where.fail("profile", "missing; expected a profile name or path")
    profile_ref = sshconfig.local_path(f.profile)
    profile_path = find_profile(profile_ref, inventory_file)
    if not profile_path.exists():  # a FIFO or a device exists: the YAML loader refuses it without reading
        available = sorted(p.stem for p in paths.profiles_dir().glob("*.yaml")) if paths.profiles_dir().is_dir() else []
        where.fail("profile", f"no profile {profile_ref!r} ({profile_path}); available: {', '.join(available) or 'none'}")
    profile, profile_image, raw_engine_args = load_profile(profile_path, name=profile_path.stem)
    if f.served_name is not None:
        profile = _replace(profile, served_name=f.served_name)
    if f.speculative_tokens is not None:
        spec = profile.speculative
        profile = _replace(profile, speculative=Speculative(spec.method, f.speculative_tokens, spec.extra))
    image = image_config(profile_image, image_set, file, where.under("image").path)
    profile = _replace(profile, engine_args=engine_args.to_argv(raw_engine_args, _series(image, file),
                                                                file=profile.file))
    if len(nodes) > 1 and profile.world_size != len(nodes):  # one node listed: the single-box layout
        raise InventoryError(
            f"profile {profile.name!r} needs tp x pp x dp = {profile.tp} x {profile.pp} x {profile.dp} = "
            f"{profile.world_size} node(s) (one GPU each) but {'the service' if service else 'the inventory'} "
            f"lists {len(nodes)} (1 = single box)", file=file, field=at(where.path, "nodes"))
    try:  # the service's view of each node: the link its group shares
        nodes = tuple(n.using(link) for n, link in zip(nodes, topology.group_links(nodes)))
    except topology.TopologyError as err:
        raise InventoryError(str(err), file=file, field=at(where.path, "nodes")) from None
    if any(n.has_gpu for n in nodes) != all(n.has_gpu for n in nodes):
        raise InventoryError("mixing gpu: none and GPU nodes is not supported", file=file, field=at(where.path, "nodes"))
    if nodes[0].has_gpu != profile.gpus:
        kind = "GPU" if profile.gpus else "CPU (gpu: none)"
        raise InventoryError(f"profile {profile.name!r} is for {kind} nodes but node {nodes[0].name} has gpu: "
                             f"{nodes[0].gpu}", file=file, field=f"nodes[{index[nodes[0].name]}].gpu")

    from sparkdeploy.model.served_tokenizer import known_vocab_size

    vocab = _vocab(f.vocab, where, inventory_file, required=f.patches.shortlist,
                   vocab_size=known_vocab_size(profile.model_id))
    return Inventory(file=file, cluster=cluster, nodes=nodes, profile=profile, image=image, patches=f.patches,
                     vocab=vocab, ports=f.ports, memory=f.memory, auth=auth, watchdog=f.watchdog, sentinel=f.sentinel,
                     service=service, backend=f.backend)


def _series(image: ImageConfig, file: str) -> str:
    from spark_overlays import compat

    try:
        return compat.series(image.vllm_version)
    except compat.CompatError as err:
        raise InventoryError(str(err), file=file, field="image.vllm_version") from None


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def _check_unique(nodes: tuple[Node, ...], in_links_form: list[bool], file: str) -> None:
    checks: list[tuple[str, Callable[[Node], Any]]] = [
        ("name", lambda n: n.name), ("ssh.host", lambda n: (n.ssh.host, n.ssh.port)),
    ]
    owner: dict[str, str] = {}  # link address -> "nodes[i].links[j].ip"
    for i, node in enumerate(nodes):
        for j, link in enumerate(node.links):
            where = f"nodes[{i}].links[{j}].ip" if in_links_form[i] else f"nodes[{i}].data_ip"
            if link.ip in owner:
                raise InventoryError(f"duplicate of {owner[link.ip]} ({link.ip})", file=file, field=where)
            owner[link.ip] = where
            if link.peer is not None and all(n.name != link.peer for n in nodes):
                raise InventoryError(f"no node named {link.peer!r} in nodes: ({', '.join(n.name for n in nodes)})",
                                     file=file, field=f"nodes[{i}].links[{j}].peer")
    for field, key in checks:
        seen: dict[Any, int] = {}
        for i, node in enumerate(nodes):
            value = key(node)
            if value in seen:
                raise InventoryError(f"duplicate of nodes[{seen[value]}].{field} ({short(value)})", file=file,
                                     field=f"nodes[{i}].{field}")
            seen[value] = i
