"""Load and validate `inventory.yaml` (and the model profile it names) into immutable, typed objects.

Every error is an `InventoryError` naming the file, the field path (`nodes[1].data_ip`) and what was expected.
Unknown keys are errors: a typo must never pass silently. Values that later reach shell or unit text are
checked here (no control characters anywhere; strict patterns for names, interfaces, hosts, image refs)
and are *also* quoted by the renderer, so validation is a second wall, not the only one.

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

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sparkdeploy import paths, yamlfile
from sparkdeploy.bench.prompts import SENTINEL_CATEGORIES
from sparkdeploy.errors import InventoryError, RemoteError
from sparkdeploy.model import credentials, engine_args, sshconfig, topology
from sparkdeploy.model.credentials import Auth
from sparkdeploy.model.fields import Fields, path_text, short
from sparkdeploy.model.profile import (
    SERVED_RE,
    ImageConfig,
    Profile,
    Speculative,
    find_profile,
    image_config,
    image_part,
    load_profile,
)
from sparkdeploy.model.topology import DEFAULT_PREFIX, Link
from sparkdeploy.node import layout
from sparkdeploy.node.layout import ServiceLayout

FEATURES = ("shortlist", "skinny_gemm", "fp8_gdn", "prefix_align")
GPU_KINDS = ("gb10", "none")
MAX_NODES = 64  # nodes, services and a service's nodes (a Spark cluster is a handful)
MAX_HCA = 16  # RoCE devices per node (a GB10 lists two to four)
MAX_LINKS = 8  # data links per node (a GB10 has two CX-7 ports, each with its twin netdev)
ROLES = ("head", "worker")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")  # Linux IFNAMSIZ - 1
HCA_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252})$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


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
class Patches:
    shortlist: bool = True
    skinny_gemm: bool = True
    fp8_gdn: bool = True
    prefix_align: bool = True

    def enabled(self) -> tuple[str, ...]:
        return tuple(f for f in FEATURES if getattr(self, f))


@dataclass(frozen=True)
class Vocab:
    path: Path  # absolute host path of the source list (stored on every node, bind-mounted read-only into the engine)
    sha256: str
    size: int  # number of ids


@dataclass(frozen=True)
class Ports:
    api: int = 8000
    master: int = 29501
    metrics: int = layout.EXPORTER_PORT  # the head's Prometheus exporter; 0 = none


@dataclass(frozen=True)
class MemoryConfig:
    reserve_gib: float = 28.0
    gpu_memory_utilization: float | None = None


@dataclass(frozen=True)
class WatchdogConfig:
    """When the watchdog takes a busy GPU at low power for a hung kernel (where nvidia-smi answers): utilization
    at or above `wedge_util_pct` at under `wedge_power_w` for `wedge_for_s`. Defaults from the field report
    (a hung GB10 kernel reads ~95 % at 16-27 W, a healthy one ~45 W: eugr/spark-vllm-docker#260)."""
    wedge_util_pct: float = 90.0
    wedge_power_w: float = 30.0
    wedge_for_s: float = 120.0


@dataclass(frozen=True)
class SentinelConfig:
    """What the speed sentinel measures after a release's gate (bench/sentinel.py `check_release`): `runs` kept
    repeats, after `warmup`, of `tokens` tokens for each prompt category. The defaults take a few seconds a category
    on a GB10; fewer categories make it shorter, and the noise it judges against comes from the runs (at least 2).
    Two records compare only where they share categories and settings."""
    categories: tuple[str, ...] = SENTINEL_CATEGORIES
    tokens: int = 32
    runs: int = 3
    warmup: int = 1


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
_LINK_SHORTHAND = ("data_ip", "netdev", "hca")
_NODE_KEYS = ("name", "role", "ssh", *_LINK_SHORTHAND, "links", "gpu")
_LINK_KEYS = ("netdev", "ip", "prefix", "hca", "peer")
_SSH_KEYS = ("host", "user", "port", "key", "known_hosts")


_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
# `render --out` writes these next to the per-node directories (plan/render.py's layout): no node may be named so
_RENDER_TOP_LEVEL = ("plan.json", "image")
def _node(raw: Any, index: int, file: str, *, in_services: bool) -> Node:
    """One entry of `nodes:`. With `services:` a node has no role of its own: each service's first node is
    its head (role is given to the service's view of the node)."""
    f = Fields(raw, f"nodes[{index}]", file, allowed=_NODE_KEYS)
    name = f.text("name", NAME_RE, what="a node name (letters, digits, '.', '_', '-'; up to 63)")
    if name in _RENDER_TOP_LEVEL:
        f.fail("name", f"{name!r} is reserved (render writes {' and '.join(_RENDER_TOP_LEVEL)} beside the node "
                       "directories); choose another node name")
    if in_services:
        if f.has("role"):
            f.fail("role", "with services:, each service's first node is its head; remove role")
        role = "worker"
    else:
        role = f.text("role", None, what="head or worker")
        if role not in ROLES:
            f.fail("role", f"{role!r} is not head or worker")
    s = f.sub("ssh", _SSH_KEYS)
    # As on the ssh command line: the inventory's values win, then ~/.ssh/config's for the host (a Host alias
    # resolves to its HostName, which the head's watchdog needs too), then root on port 22. Key paths stay as
    # written (`~/.ssh/...`: plans do not depend on who runs the kit); remote expands `~` and `$VAR` at connect.
    host = s.text("host", HOST_RE, what="a host name, IP address or ~/.ssh/config Host alias")
    try:
        cfg = sshconfig.ssh_config(host)
        cfg_port = int(cfg.get("port", 22))
    except (RemoteError, ValueError) as err:
        s.fail("host", f"~/.ssh/config for {host!r}: {err}")
    ssh = SshTarget(
        host=cfg["hostname"],
        user=s.text("user", USER_RE, None, what="a login name") or cfg.get("user") or "root",
        port=s.integer("port", 1, 65535, None, what="a port 1..65535") or cfg_port,
        key=path_text(s, "key", None) or sshconfig.identity_of(cfg),
        known_hosts=path_text(s, "known_hosts", None),
        proxy_jump=cfg.get("proxyjump"),
    )
    shorthand = [key for key in _LINK_SHORTHAND if f.has(key)]
    if f.has("links"):
        if shorthand:
            f.fail(shorthand[0], "give links: or the one-link shorthand (data_ip, netdev, hca), not both; move "
                                 f"{', '.join(shorthand)} into an entry of links:")
        raw_links = f.items("links", MAX_LINKS, what="a list of data links ({netdev, ip, prefix, hca, peer})")
        if not raw_links:
            f.fail("links", "must list at least one data link ({netdev, ip, prefix, hca, peer})")
        links = tuple(_link(Fields(raw, f.at(f"links[{i}]"), file, allowed=_LINK_KEYS)) for i, raw in
                      enumerate(raw_links))
        _check_own_links(f, name, links)
    elif not shorthand:
        f.fail("data_ip", "missing; give the node's data link as data_ip, netdev and hca, or its links as "
                          "links: [{netdev, ip, prefix, hca, peer}, ...]")
    else:
        links = (_link(f, ip_key="data_ip"),)
    gpu = f.text("gpu", None, "gb10", what="gb10 or none")
    if gpu not in GPU_KINDS:
        f.fail("gpu", f"{gpu!r} is not one of {', '.join(GPU_KINDS)}")
    first = links[0]
    return Node(name=name, role=role, ssh=ssh, data_ip=first.ip, netdev=first.netdev, hca=first.hca, gpu=gpu,
                links=links)


def _link(f: Fields, ip_key: str = "ip") -> Link:
    """One data link: an entry of `links:` (ip, prefix, peer) or a node's shorthand (data_ip, netdev, hca)."""
    ip = f.text(ip_key, None, what="an IPv4 address")
    try:
        address = ipaddress.IPv4Address(ip)
    except ValueError:
        f.fail(ip_key, f"{short(ip)} is not an IPv4 address")
    if address.is_unspecified or address.is_loopback or address.is_multicast or address == _BROADCAST:
        f.fail(ip_key, f"{address} is not a node's own address; expected the IPv4 address of this node on the "
                       "data network (the other ranks connect to it), not 0.0.0.0, loopback, multicast or broadcast")
    netdev = f.text("netdev", IFNAME_RE, what="a network interface name (1-15 of letters, digits, '.', '_', '-')")
    prefix = f.integer("prefix", 8, 31, DEFAULT_PREFIX, what="a subnet prefix length 8..31") if ip_key == "ip" \
        else DEFAULT_PREFIX
    hca_raw = f.items("hca", MAX_HCA, [], what="a list of RoCE device names")
    hca: dict[str, None] = {}  # insertion-ordered, so a repeat is found in constant time
    for i, dev in enumerate(hca_raw):
        if not isinstance(dev, str) or not HCA_RE.fullmatch(dev):
            f.fail(f"hca[{i}]", f"{short(dev)} is not a RoCE device name")
        if dev in hca:
            f.fail(f"hca[{i}]", f"{dev!r} listed twice")
        hca[dev] = None
    peer = f.text("peer", NAME_RE, None, what="the name of the node at the other end") if ip_key == "ip" else None
    return Link(netdev=netdev, ip=str(address), prefix=prefix, hca=tuple(hca), peer=peer)


def _check_own_links(f: Fields, node: str, links: tuple[Link, ...]) -> None:
    """A node's links are distinct ports: each netdev, and each subnet, once (two links on one subnet would leave
    the choice of port to the routing table, not to the plan)."""
    for i, link in enumerate(links):
        for j, other in enumerate(links[:i]):
            if link.netdev == other.netdev:
                f.fail(f"links[{i}].netdev", f"{link.netdev!r} is also links[{j}] of node {node}: one entry per port")
            if link.subnet == other.subnet:
                f.fail(f"links[{i}].ip", f"{link.describe()} is on {link.subnet}, like links[{j}] "
                                         f"({other.describe()}): each link of a node is its own subnet")
        if link.peer == node:
            f.fail(f"links[{i}].peer", f"{node!r} is this node; peer names the node at the link's other end")


# ------------------------------------------------------------------------------------------------ load
_TOP_KEYS = ("cluster", "profile", "nodes", "image", "patches", "vocab", "ports", "memory", "speculative_tokens",
             "auth", "services", "served_name", "router", "backend", "watchdog", "sentinel")
# One service: at the top level of an inventory without `services:`, else in each entry of `services:`
_SERVICE_KEYS = ("name", "profile", "nodes", "image", "patches", "vocab", "ports", "memory", "speculative_tokens",
                 "served_name", "backend", "watchdog", "sentinel", "replicas")
MAX_REPLICAS = 8
BACKENDS = ("mp", "ray")


def _auth(f: Fields, inventory_file: Path) -> Auth:
    """Secret files are local paths (`~`, `$VAR` expanded, relative to the inventory), read now so a bad one exits 2."""
    a = f.sub("auth", ("api_key_file", "hf_token_file"), required=False)
    found: dict[str, Path] = {}
    for key in ("api_key_file", "hf_token_file"):
        ref = path_text(a, key, None)
        if ref is None:
            continue
        path = Path(sshconfig.local_path(ref))
        path = path if path.is_absolute() else inventory_file.parent / path
        try:
            credentials.read_secret(path, a.at(key))
        except InventoryError as err:
            raise InventoryError(err.reason, file=str(inventory_file), field=a.at(key)) from None
        found[key] = path
    return Auth(**found)


def _vocab(f: Fields, inventory_file: Path, required: bool, vocab_size: int | None) -> Vocab | None:
    """The draft list, read by the one reader the engine uses (spark_overlays.vocab_list: format, bounds,
    sorted, unique) and checked against the served tokenizer's vocabulary size when it is recorded."""
    from spark_overlays import vocab_list

    if not f.has("vocab"):
        if required:
            f.fail("vocab", "missing; patches.shortlist is on, so a draft vocab list (one id per line) is needed")
        return None
    ref = path_text(f, "vocab")
    path = Path(sshconfig.local_path(ref))
    if not path.is_absolute():
        path = inventory_file.parent / path
    try:
        data = vocab_list.read_bytes(path)
        ids = vocab_list.parse_text(data, str(path), vocab_size)
    except vocab_list.VocabListError as err:
        f.fail("vocab", str(err))
    if not ids.size:
        f.fail("vocab", f"{path} holds no token ids")
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
    f = Fields(raw, "", file, allowed=_TOP_KEYS)
    cluster = f.text("cluster", NAME_RE, "sparkdeploy", what="a cluster name (letters, digits, '.', '_', '-')")
    in_services = f.has("services")

    nodes_raw = f.items("nodes", MAX_NODES, what="a list of nodes")
    if not nodes_raw:
        f.fail("nodes", "must list at least one node")
    nodes = tuple(_node(raw_node, i, file, in_services=in_services) for i, raw_node in enumerate(nodes_raw))
    _check_unique(nodes, [isinstance(r, dict) and "links" in r for r in nodes_raw], file)
    auth = _auth(f, inventory_file)
    if not in_services:
        if f.has("router"):
            f.fail("router", "a router fronts several services; it needs `services:` (one service is its own endpoint)")
        heads = [i for i, n in enumerate(nodes) if n.role == "head"]
        if len(heads) != 1:
            where = "nodes" if not heads else f"nodes[{heads[1]}].role"
            raise InventoryError(f"exactly one node must have role: head, found {len(heads)}", file=file, field=where)
        return (_service(f, cluster, nodes, inventory_file, auth, raw.get("image"), {n.name: i for i, n in
                                                                                   enumerate(nodes)}),)

    for key in _SERVICE_KEYS:
        if key not in ("name", "nodes", "image") and key in raw:
            f.fail(key, f"with services:, {key} belongs to each service (services[N].{key})")
    services_raw = f.items("services", MAX_NODES, what="a list of services")
    if not services_raw:
        f.fail("services", "must list at least one service")
    index = {n.name: i for i, n in enumerate(nodes)}
    views: list[Inventory] = []
    for si, service_raw in enumerate(services_raw):
        s = Fields(service_raw, f"services[{si}]", file, allowed=_SERVICE_KEYS)
        name = s.text("name", NAME_RE, what="a service name (letters, digits, '.', '_', '-'; up to 63)")
        if any(v.service == name for v in views):
            s.fail("name", f"{name!r} names two services")
        if name == "router":
            s.fail("name", "'router' names the router in reports (health, up --json); choose another name")
        listed = s.items("nodes", MAX_NODES, what="a list of node names, its head first")
        if not listed:
            s.fail("nodes", "must list at least one node, its head first")
        replicas = s.integer("replicas", 1, MAX_REPLICAS, 1,
                             what=f"an integer 1..{MAX_REPLICAS} (copies of the service, each on its own nodes)")
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
        shared, own = raw.get("image"), service_raw.get("image")  # the service's keys win, key by key
        image_raw = {**shared, **own} if isinstance(shared, dict) and isinstance(own, dict) else \
            (shared if own is None else own)
        for r in range(replicas):
            view = _service(s, f"{cluster}.{name}", tuple(members[r * size:(r + 1) * size]), inventory_file, auth,
                            image_raw, index, service=name)
            views.append(_replace(view, replica=r + 1 if replicas > 1 else 0))
    names = tuple(dict.fromkeys(str(v.service) for v in views))
    tenants = _tenants(f, nodes, views, names)
    router = _router(f, nodes, views, names)

    def outside(v: Inventory) -> tuple[Node, ...]:
        """The nodes no copy of v's service runs on (another replica's nodes run the same units)."""
        mine = {n.name for w in views if w.service == v.service for n in w.nodes}
        return tuple(n for n in nodes if n.name not in mine)

    return tuple(_replace(v, router=router, services=names, tenants=tenants, elsewhere=outside(v)) for v in views)


def _tenants(f: Fields, nodes: tuple[Node, ...], views: list[Inventory],
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
                    f.fail(f"services[{si}].ports.{key}", f"{port} is already {taken[port]} on node {node.name}, "
                           "the head of both: give services whose heads share a node their own ports")
                taken[port] = f"service {v.service}'s ports.{key}"
        if len(on) > 1:
            tenants.append((node.name, tuple(v.service for _, v in on)))
    return tuple(tenants)


def _router(f: Fields, nodes: tuple[Node, ...], views: list[Inventory], names: tuple[str, ...]) -> RouterConfig | None:
    """`router: {node, port}`: on a listed node, its port free of that node's service ports, and behind the API
    key (its admin API, which adds and removes workers, is otherwise open to whoever reaches the port)."""
    if not f.has("router"):
        return None
    r = f.sub("router", ("node", "port"))
    name = r.text("node", NAME_RE, what="the name of the node the router runs on")
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        r.fail("node", f"no node named {short(name)} in nodes: ({', '.join(n.name for n in nodes)})")
    port = r.integer("port", 1, 65535, 8080, what="a port 1..65535")
    by_name: dict[str, Inventory] = {}
    for v in views:
        si = names.index(str(v.service))
        other = by_name.setdefault(v.profile.served_name, v)
        if other.profile.name != v.profile.name:
            f.fail(f"services[{si}].served_name", f"{v.profile.served_name!r} is also service {other.service}'s model "
                   "name, with another profile: the router sends a model's requests to every service serving that "
                   "name, so give each model its own (services[].served_name)")
    for v in views:
        if any(n.name == name for n in v.nodes) and port in (v.ports.api, v.ports.master, v.ports.metrics):
            r.fail("port", f"{port} is already service {v.service}'s port on {name} (services[].ports)")
    if views[0].auth.api_key_file is None:
        f.fail("router", "the router needs auth.api_key_file: its admin API adds and removes workers, so it only "
                         "answers requests that carry the services' API key")
    return RouterConfig(node=node, port=port)


def _service(f: Fields, cluster: str, nodes: tuple[Node, ...], inventory_file: Path, auth: Auth, image_raw: Any,
             index: dict[str, int], service: str | None = None) -> Inventory:
    """What one service is: profile, patches, MTP depth, image, ports, memory and draft list read from `f` (the
    top level, or one entry of `services:`), checked against the nodes it runs on."""
    file = str(inventory_file)
    profile_ref = sshconfig.local_path(f.text("profile", re.compile(r"^[A-Za-z0-9_./~${}-]+$"),
                                              what="a profile name or path"))
    if len(profile_ref) > 1024 or any(len(part) > 250 for part in profile_ref.split("/")):
        f.fail("profile", "too long; expected a profile name or path (at most 250 characters per path component)")
    profile_path = find_profile(profile_ref, inventory_file)
    if not profile_path.exists():  # a FIFO or a device exists: the YAML loader refuses it without reading
        available = sorted(p.stem for p in paths.profiles_dir().glob("*.yaml")) if paths.profiles_dir().is_dir() else []
        f.fail("profile", f"no profile {profile_ref!r} ({profile_path}); available: {', '.join(available) or 'none'}")
    profile, profile_image, raw_engine_args = load_profile(profile_path, name=profile_path.stem)

    pt = f.sub("patches", FEATURES, required=False)
    patches = Patches(**{feat: pt.flag(feat, True) for feat in FEATURES})

    served_name = f.text("served_name", SERVED_RE, None, what="a served model name (what requests ask for)")
    if served_name is not None:
        profile = _replace(profile, served_name=served_name)

    backend = f.text("backend", None, "mp", what="mp or ray")
    if backend not in BACKENDS:
        f.fail("backend", f"{short(backend)} is not one of {', '.join(BACKENDS)} (mp: vLLM's own multi-node "
                          "launcher, the default; ray: a Ray cluster across the service's nodes)")

    depth = f.integer("speculative_tokens", 0, 8, None, what="an integer 0..8 (MTP depth; 0 = off)")
    if depth is not None:
        spec = profile.speculative
        profile = _replace(profile, speculative=Speculative(spec.method, depth, spec.extra))

    image = image_config(profile_image, image_part(image_raw, f.at("image"), file), file, f.at("image"))
    profile = _replace(profile, engine_args=engine_args.to_argv(raw_engine_args, _series(image, file),
                                                                file=profile.file))

    po = f.sub("ports", ("api", "master", "metrics"), required=False)
    ports = Ports(api=po.integer("api", 1, 65535, 8000, what="a port 1..65535"),
                  master=po.integer("master", 1, 65535, 29501, what="a port 1..65535"),
                  metrics=po.integer("metrics", 0, 65535, layout.EXPORTER_PORT,
                                     what="a port 1..65535 for the head's Prometheus exporter, or 0 for none"))
    if ports.api == ports.master:
        po.fail("master", f"must differ from ports.api ({ports.api})")
    if ports.metrics in (ports.api, ports.master):
        po.fail("metrics", f"must differ from ports.api ({ports.api}) and ports.master ({ports.master})")

    me = f.sub("memory", ("reserve_gib", "gpu_memory_utilization"), required=False)
    memory = MemoryConfig(
        reserve_gib=me.number("reserve_gib", 1.0, 512.0, 28.0, what="GiB kept for the host, 1..512"),
        gpu_memory_utilization=me.number("gpu_memory_utilization", 0.05, 0.99, None,
                                         what="a fraction 0.05..0.99 (or null to derive it)"),
    )

    wd = f.sub("watchdog", ("wedge_util_pct", "wedge_power_w", "wedge_for_s"), required=False)
    watchdog = WatchdogConfig(
        wedge_util_pct=wd.number("wedge_util_pct", 1.0, 100.0, 90.0, what="a GPU utilization in % (1..100)"),
        wedge_power_w=wd.number("wedge_power_w", 1.0, 1000.0, 30.0,
                                what="watts (1..1000): busy under this draw is a hung kernel"),
        wedge_for_s=wd.number("wedge_for_s", 10.0, 86400.0, 120.0, what="seconds (10..86400) busy at low power"),
    )

    sentinel = _sentinel(f)
    if len(nodes) > 1 and profile.world_size != len(nodes):  # one node listed: the single-box layout
        raise InventoryError(
            f"profile {profile.name!r} needs tp x pp x dp = {profile.tp} x {profile.pp} x {profile.dp} = "
            f"{profile.world_size} node(s) (one GPU each) but {'the service' if service else 'the inventory'} "
            f"lists {len(nodes)} (1 = single box)", file=file, field=f.at("nodes"))
    try:  # the service's view of each node: the link its group shares
        nodes = tuple(n.using(link) for n, link in zip(nodes, topology.group_links(nodes)))
    except topology.TopologyError as err:
        raise InventoryError(str(err), file=file, field=f.at("nodes")) from None
    if any(n.has_gpu for n in nodes) != all(n.has_gpu for n in nodes):
        raise InventoryError("mixing gpu: none and GPU nodes is not supported", file=file, field=f.at("nodes"))
    if nodes[0].has_gpu != profile.gpus:
        kind = "GPU" if profile.gpus else "CPU (gpu: none)"
        raise InventoryError(f"profile {profile.name!r} is for {kind} nodes but node {nodes[0].name} has gpu: "
                             f"{nodes[0].gpu}", file=file, field=f"nodes[{index[nodes[0].name]}].gpu")

    from sparkdeploy.model.served_tokenizer import known_vocab_size

    vocab = _vocab(f, inventory_file, required=patches.shortlist, vocab_size=known_vocab_size(profile.model_id))
    return Inventory(file=file, cluster=cluster, nodes=nodes, profile=profile, image=image, patches=patches,
                     vocab=vocab, ports=ports, memory=memory, auth=auth, watchdog=watchdog, sentinel=sentinel,
                     service=service, backend=backend)


def _sentinel(f: Fields) -> SentinelConfig:
    se = f.sub("sentinel", ("categories", "tokens", "runs", "warmup"), required=False)
    cats = se.items("categories", len(SENTINEL_CATEGORIES), SENTINEL_CATEGORIES,
                    what=f"a non-empty list of prompt categories from {', '.join(SENTINEL_CATEGORIES)}")
    for i, cat in enumerate(cats):
        if cat not in SENTINEL_CATEGORIES:
            se.fail(f"categories[{i}]", f"{cat!r} is not a category the sentinel measures (one of: "
                                        f"{', '.join(SENTINEL_CATEGORIES)})")
    if not cats or len(set(cats)) != len(cats):
        se.fail("categories", "a non-empty list, each category once")
    return SentinelConfig(
        categories=tuple(cats),
        tokens=se.integer("tokens", 2, 4096, 32, what="tokens per request, 2..4096"),
        runs=se.integer("runs", 2, 20, 3, what="kept runs per category, 2..20 (the noise is measured from them)"),
        warmup=se.integer("warmup", 0, 10, 1, what="warm-up runs per category, 0..10"))


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
