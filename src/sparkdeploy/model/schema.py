"""The shape of `inventory.yaml` and of a model profile, declared once: every key, its type, range or pattern, its
default, and the words its error uses (`model/fields.py` makes the leaves and reads a file against a shape).

`inventory.py` and `profile.py` read a file with `fields.read(InventoryFile | ProfileFile, ...)`, then check what
spans keys or files (exactly one head, unique addresses, links or the one-link shorthand, ports across services,
the profile a service names, the list against the tokenizer) and build the typed objects the planner uses.
`Patches`, `Ports`, `MemoryConfig`, `WatchdogConfig` and `SentinelConfig` are both a section of the file and the
object the rest of the kit reads.
"""

import dataclasses
import ipaddress
import math
import posixpath
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from sparkdeploy.bench.prompts import SENTINEL_CATEGORIES
from sparkdeploy.model.checkpoint import KNOWN_FORMATS
from sparkdeploy.model.fields import (
    CONTROL_RE,
    Flag,
    Int,
    Items,
    Num,
    OneOf,
    PathText,
    Text,
    bad,
    kind_of,
    leaf,
    section,
    short,
)
from sparkdeploy.model.topology import DEFAULT_PREFIX
from sparkdeploy.node.layout import EXPORTER_PORT, STATE_DIR, VOCAB_CONTAINER_DIR

MAX_NODES = 64  # nodes, services and a service's nodes (a Spark cluster is a handful)
MAX_HCA = 16  # RoCE devices per node (a GB10 lists two to four)
MAX_LINKS = 8  # data links per node (a GB10 has two CX-7 ports, each with its twin netdev)
MAX_REPLICAS = 8
GPU_KINDS = ("gb10", "none")
BACKENDS = ("mp", "ray")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")  # Linux IFNAMSIZ - 1
HCA_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252})$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
PROFILE_REF_RE = re.compile(r"^[A-Za-z0-9_./~${}-]+$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([A-Za-z0-9._-]{0,40})$")  # part of the image tag: no '+'
SERVED_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
REPO_RE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
COMMAND_RE = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./ =-]*$")
SIZE_RE = re.compile(r"^[0-9]+[bkmg]?$")
# `render --out` writes these next to the per-node directories (plan/render.py's layout): no node may be named so
RENDER_TOP_LEVEL = ("plan.json", "image")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


# ------------------------------------------------------------------------------------------ leaf checks
def _node_name(value: str) -> None:
    if value in RENDER_TOP_LEVEL:
        raise bad(f"{value!r} is reserved (render writes {' and '.join(RENDER_TOP_LEVEL)} beside the node "
                  "directories); choose another node name")


def _ipv4(value: str) -> None:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise bad(f"{short(value)} is not an IPv4 address") from None
    if address.is_unspecified or address.is_loopback or address.is_multicast or address == _BROADCAST:
        raise bad(f"{address} is not a node's own address; expected the IPv4 address of this node on the data "
                  "network (the other ranks connect to it), not 0.0.0.0, loopback, multicast or broadcast")


def _hca_item(value: Any) -> Any:
    if not isinstance(value, str) or not HCA_RE.fullmatch(value):
        raise bad(f"{short(value)} is not a RoCE device name")
    return value


def _each_once(words: str) -> Any:
    def check(values: list) -> None:
        for i, value in enumerate(values):
            if value in values[:i]:
                raise bad(words.format(value=value), at=f"[{i}]")
    return check


def _profile_ref(value: str) -> None:
    if len(value) > 1024 or any(len(part) > 250 for part in value.split("/")):
        raise bad("too long; expected a profile name or path (at most 250 characters per path component)")


def _service_name(value: str) -> None:
    if value == "router":
        raise bad("'router' names the router in reports (health, up --json); choose another name")


def _vllm_version(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, float)):
        raise bad(f"expected a vLLM version such as 0.33.0, got {kind_of(value)} ({short(value)})")
    version = str(value)
    if CONTROL_RE.search(version):
        raise bad("control characters (newline, tab, NUL...) are not allowed")
    if not VERSION_RE.fullmatch(version):
        raise bad(f"{short(version)} is not a version such as 0.33.0 (digits, then letters, digits, '.', '_', '-': "
                  "it becomes part of the image tag, so no '+')")
    return version


# Host directories never taken as a model directory: eviction reads every file under it and `weights sync`
# writes the head's files into it on every worker. The trees are refused with everything below them (except the
# kit's own model store), the tops of user trees only as themselves, and any .ssh directory anywhere.
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                 "/sys", "/usr", "/var/lib", "/var/log", "/var/run", "/var/spool", "/var/cache")
_SYSTEM_TOPS = ("/", "/var", "/home", "/root", "/opt", "/srv", "/mnt", "/media", "/tmp")
MODEL_STORE = f"{STATE_DIR}/models"  # the shipped profiles' host_dir parent: /var/lib/sparkdeploy/models/<name>


def _system_dir(value: str) -> bool:
    path = "/" + posixpath.normpath(value).lstrip("/")
    if path.startswith(MODEL_STORE + "/"):
        return False
    return (path in _SYSTEM_TOPS or ".ssh" in path.split("/")
            or any(path == tree or path.startswith(tree + "/") for tree in _SYSTEM_TREES))


def _model_path(value: str) -> None:
    path, vocab = posixpath.normpath(value), VOCAB_CONTAINER_DIR
    if path == "/" or path == vocab or path.startswith(vocab + "/") or vocab.startswith(path + "/"):
        raise bad(f"{short(value)} overlaps {vocab}, where the container mounts the draft vocabulary; expected a "
                  "directory of its own, such as /models/<name>")


def _host_dir(value: str) -> None:
    if _system_dir(value):
        raise bad(f"{short(value)} is a system directory or lies below one; expected the directory that holds the "
                  f"checkpoint, such as /srv/models/<name> or {MODEL_STORE}/<name>")


# Names that hold a secret: a profile's env lands in a 0644 engine.env, `plan` output and the release id.
SECRET_ENV_RE = re.compile(r"VLLM_API_KEY|HF_TOKEN|.*_TOKEN|.*_KEY|.*SECRET.*|.*PASSWORD.*", re.IGNORECASE)


def _env(raw: Any) -> tuple[tuple[str, str], ...]:
    """The container env, sorted; secret-like names are refused (their place is the inventory's `auth:`, a 0600
    file)."""
    if not isinstance(raw, dict):
        raise bad(f"expected a mapping of NAME: value, got {kind_of(raw)}")
    out = []
    for key in sorted(raw, key=str):
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise bad(f"{short(key)} is not an environment variable name")
        if SECRET_ENV_RE.fullmatch(key):
            raise bad("looks like a secret, and a profile's env is written in clear to engine.env, the plan and the "
                      "release id; give the API key as auth.api_key_file and the Hugging Face token as "
                      "auth.hf_token_file in the inventory (0600 files)", at=f".{key}")
        value = raw[key]
        if isinstance(value, bool):
            value = "1" if value else "0"
        if not isinstance(value, (str, int, float)):
            raise bad(f"expected a string or number, got {kind_of(value)}", at=f".{key}")
        value = str(value)
        if CONTROL_RE.search(value):
            raise bad("control characters (newline, tab, NUL...) are not allowed", at=f".{key}")
        out.append((key, value))
    return tuple(out)


def _speculative(raw: Any) -> tuple[tuple[str, Any], ...]:
    """The speculative config: `method` and `num_speculative_tokens`, and any other key vLLM's JSON config takes
    (a string, number or boolean), as sorted pairs."""
    if not isinstance(raw, dict):
        raise bad(f"expected a mapping, got {kind_of(raw)}")
    for key, what in (("method", "a speculative method (mtp, ngram, ...)"),
                      ("num_speculative_tokens", "an integer 0..8 (0 = off)")):
        if raw.get(key) is None:
            raise bad(f"missing; expected {what}", at=f".{key}")
    method = raw["method"]
    if not isinstance(method, str) or not re.fullmatch(r"[a-z0-9_]+", method):
        raise bad(f"{short(method)} is not a speculative method (mtp, ngram, ...)", at=".method")
    depth = raw["num_speculative_tokens"]
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise bad(f"expected an integer 0..8 (0 = off), got {kind_of(depth)} ({short(depth)})",
                  at=".num_speculative_tokens")
    if not 0 <= depth <= 8:
        raise bad(f"{depth} out of range; expected an integer 0..8 (0 = off)", at=".num_speculative_tokens")
    for key in sorted(raw, key=str):
        value = raw[key]
        if not isinstance(key, str):
            raise bad(f"keys must be strings, got {key!r}")
        if not isinstance(value, (str, int, float, bool)):
            raise bad(f"expected a string, number or boolean, got {kind_of(value)} ({short(value)})", at=f".{key}")
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(f"{value} is not a number vLLM's JSON config takes", at=f".{key}")
        if isinstance(value, str) and CONTROL_RE.search(value):
            raise bad("control characters (newline, tab, NUL...) are not allowed", at=f".{key}")
    return tuple((k, raw[k]) for k in sorted(raw))


# ------------------------------------------------------------------------------------------------ leaves
# Read as a mapping, kept as sorted pairs: the JSON Schema says what the file holds.
Env = Annotated[tuple, BeforeValidator(_env), Field(description="a mapping of NAME: value"),
                WithJsonSchema({"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}})]
NodeName = Text("a node name (letters, digits, '.', '_', '-'; up to 63)", NAME_RE, check=_node_name)
IPv4 = Text("an IPv4 address", check=_ipv4)
Netdev = Text("a network interface name (1-15 of letters, digits, '.', '_', '-')", IFNAME_RE)
Hcas = Items(Annotated[str, BeforeValidator(_hca_item)], MAX_HCA, "a list of RoCE device names",
             check=_each_once("{value!r} listed twice"))
Port = Int(1, 65535, "a port 1..65535")
Command = Text("a command (letters, digits, '_./=-' and spaces)", COMMAND_RE)
ServedName = Text("a served model name (what requests ask for)", SERVED_RE)


# ------------------------------------------------------------------------------------------- inventory
@section
class Patches:
    """Which of the four performance patches a release carries (all on by default)."""
    shortlist: Flag = True
    skinny_gemm: Flag = True
    fp8_gdn: Flag = True
    prefix_align: Flag = True

    def enabled(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name))


FEATURES = tuple(f.name for f in dataclasses.fields(Patches))


@section
class Ports:
    api: Port = 8000
    master: Port = 29501
    metrics: Int(0, 65535, "a port 1..65535 for the head's Prometheus exporter, or 0 for none") = EXPORTER_PORT

    @model_validator(mode="after")
    def _distinct(self) -> "Ports":
        if self.api == self.master:
            raise bad(f"must differ from ports.api ({self.api})", at=".master")
        if self.metrics in (self.api, self.master):
            raise bad(f"must differ from ports.api ({self.api}) and ports.master ({self.master})", at=".metrics")
        return self


@section
class MemoryConfig:
    """See plan/memory.py: what the host keeps, and the engine's fraction (None: derived from the budget)."""
    reserve_gib: Num(1.0, 512.0, "GiB kept for the host, 1..512") = 28.0
    gpu_memory_utilization: Num(0.05, 0.99, "a fraction 0.05..0.99 (or null to derive it)") = None


@section
class WatchdogConfig:
    """When the watchdog takes a busy GPU at low power for a hung kernel (where nvidia-smi answers): utilization
    at or above `wedge_util_pct` at under `wedge_power_w` for `wedge_for_s`. Defaults from the field report
    (a hung GB10 kernel reads ~95 % at 16-27 W, a healthy one ~45 W: eugr/spark-vllm-docker#260)."""
    wedge_util_pct: Num(1.0, 100.0, "a GPU utilization in % (1..100)") = 90.0
    wedge_power_w: Num(1.0, 1000.0, "watts (1..1000): busy under this draw is a hung kernel") = 30.0
    wedge_for_s: Num(10.0, 86400.0, "seconds (10..86400) busy at low power") = 120.0


def _category(value: Any) -> Any:
    if value not in SENTINEL_CATEGORIES:
        raise bad(f"{short(value)} is not a category the sentinel measures (one of: {', '.join(SENTINEL_CATEGORIES)})")
    return value


def _categories(values: list) -> None:
    if not values or any(v in values[:i] for i, v in enumerate(values)):
        raise bad("a non-empty list, each category once")


@section
class SentinelConfig:
    """What the speed sentinel measures after a release's gate (bench/sentinel.py `check_release`): `runs` kept
    repeats, after `warmup`, of `tokens` tokens for each prompt category. The defaults take a few seconds a category
    on a GB10; fewer categories make it shorter, and the noise it judges against comes from the runs (at least 2).
    Two records compare only where they share categories and settings."""
    categories: Items(Annotated[str, BeforeValidator(_category)], len(SENTINEL_CATEGORIES),
                      f"a non-empty list of prompt categories from {', '.join(SENTINEL_CATEGORIES)}",
                      check=_categories) = SENTINEL_CATEGORIES
    tokens: Int(2, 4096, "tokens per request, 2..4096") = 32
    runs: Int(2, 20, "kept runs per category, 2..20 (the noise is measured from them)") = 3
    warmup: Int(0, 10, "warm-up runs per category, 0..10") = 1


@section
class SshEntry:
    host: Text("a host name, IP address or ~/.ssh/config Host alias", HOST_RE)
    user: Text("a login name", USER_RE) = None
    port: Port = None
    key: PathText() = None
    known_hosts: PathText() = None


@section
class LinkEntry:
    """One data link of a node: its netdev, address and subnet, its RoCE devices, the node at the other end."""
    netdev: Netdev
    ip: IPv4
    prefix: Int(8, 31, "a subnet prefix length 8..31") = DEFAULT_PREFIX
    hca: Hcas = ()
    peer: Text("the name of the node at the other end", NAME_RE) = None


@section(kw_only=True)
class NodeEntry:
    """A node: its data links as `links:` or the one-link shorthand (data_ip, netdev, hca: prefix 24)."""
    name: NodeName
    role: Text("head or worker") = None  # with services: each service's first node is its head
    ssh: SshEntry
    data_ip: IPv4 = None
    netdev: Netdev = None
    hca: Hcas = None
    links: Items(LinkEntry, MAX_LINKS, "a list of data links ({netdev, ip, prefix, hca, peer})") = None
    gpu: OneOf(GPU_KINDS, "gb10 or none", lambda v: f"{v!r} is not one of {', '.join(GPU_KINDS)}") = "gb10"


@section(kw_only=True)
class ImagePart:
    """An `image:` block (the profile's defaults, the inventory's, a service's), merged key by key."""
    base: Text("an image reference") = None
    vllm_version: Annotated[str, BeforeValidator(_vllm_version), Field(description="a vLLM version such as 0.33.0")] \
        = None
    local: Flag = None
    repository: Text("an image repository name (lowercase)", REPO_RE) = None
    python: Command = None
    pip: Command = None

    def present(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@section(kw_only=True)
class AuthFiles:
    api_key_file: PathText() = None
    hf_token_file: PathText() = None


@section(kw_only=True)
class RouterEntry:
    node: Text("the name of the node the router runs on", NAME_RE)
    port: Port = 8080


@section(kw_only=True)
class ServiceKeys:
    """What one service is: at the top level of an inventory without `services:`, else in each of its entries."""
    profile: Text("a profile name or path", PROFILE_REF_RE, check=_profile_ref) = None
    image: ImagePart = None
    patches: Patches = Patches()
    vocab: PathText() = None
    ports: Ports = Ports()
    memory: MemoryConfig = MemoryConfig()
    speculative_tokens: Int(0, 8, "an integer 0..8 (MTP depth; 0 = off)") = None
    served_name: ServedName = None
    backend: OneOf(BACKENDS, "mp or ray", lambda v: f"{short(v)} is not one of {', '.join(BACKENDS)} (mp: vLLM's own "
                   "multi-node launcher, the default; ray: a Ray cluster across the service's nodes)") = "mp"
    watchdog: WatchdogConfig = WatchdogConfig()
    sentinel: SentinelConfig = SentinelConfig()


@section(kw_only=True)
class ServiceEntry(ServiceKeys):
    name: Text("a service name (letters, digits, '.', '_', '-'; up to 63)", NAME_RE, check=_service_name)
    nodes: Items(Any, MAX_NODES, "a list of node names, its head first")
    replicas: Int(1, MAX_REPLICAS, f"an integer 1..{MAX_REPLICAS} (copies of the service, each on its own nodes)") = 1


@section(kw_only=True)
class InventoryFile(ServiceKeys):
    """`inventory.yaml` (see the docstring of `model/inventory.py` for a commented example)."""
    cluster: Text("a cluster name (letters, digits, '.', '_', '-')", NAME_RE) = "sparkdeploy"
    nodes: Items(NodeEntry, MAX_NODES, "a list of nodes")
    auth: AuthFiles = AuthFiles()
    services: Items(ServiceEntry, MAX_NODES, "a list of services") = None
    router: RouterEntry = None


# --------------------------------------------------------------------------------------------- profile
@section(kw_only=True)
class ModelEntry:
    id: Text("a model id")
    path: PathText(absolute=True, mount=True, then=_model_path)
    host_dir: PathText(absolute=True, mount=True, then=_host_dir) = None
    served_name: Text("a served model name", SERVED_RE)
    weights_gib: Num(0.0, 4096.0, "GiB of weights, 0..4096") = 0.0
    kv_bytes_per_token: Int(0, 1 << 30) = 0


@section(kw_only=True)
class ParallelEntry:
    tp: Int(1, 64) = 1
    pp: Int(1, 64) = 1
    dp: Int(1, 64) = 1
    expert_parallel: Flag = False


@section(kw_only=True)
class EngineEntry:
    max_model_len: Int(16, 1 << 24)
    max_num_seqs: Int(1, 4096) = None
    max_num_batched_tokens: Int(16, 1 << 24) = None
    kv_cache_dtype: OneOf(KV_DTYPES, f"one of {', '.join(KV_DTYPES)}",
                          lambda v: f"{v!r} is not one of {', '.join(KV_DTYPES)}") = None
    enforce_eager: Flag = False
    prefix_caching: Flag = True
    activation_gib: Num(0.0, 1024.0, "GiB, 0..1024") = 2.0


@section(kw_only=True)
class ContainerEntry:
    gpus: Flag = True
    rdma: Flag = True
    shm_size: Text("a size such as 16g", SIZE_RE) = "16g"
    caches: Flag = True


@section(kw_only=True)
class CheckpointEntry:
    format: OneOf(KNOWN_FORMATS, f"a checkpoint format ({', '.join(KNOWN_FORMATS)})",
                  lambda v: f"{short(v)} is not one of {', '.join(KNOWN_FORMATS)}") = None


@section(kw_only=True)
class ShortlistEntry:
    capacity: Int(1, 1 << 24, "draft head rows, 1..16777216") = None
    live_check_every: Int(0, 1 << 20, "drafter calls between pointer checks, 0..1048576 (0 = off)") = 0


@section(kw_only=True)
class ProfileFile:
    """A model profile, `deploy/profiles/<name>.yaml`."""
    description: leaf(str, (str,), "a string") = ""
    model: ModelEntry
    parallel: ParallelEntry
    speculative: Annotated[tuple, BeforeValidator(_speculative),
                           Field(description="a mapping: method, num_speculative_tokens, and vLLM's other keys"),
                           WithJsonSchema({"type": "object", "required": ["method", "num_speculative_tokens"]})] = None
    engine: EngineEntry
    engine_args: Any = None  # checked against the pinned vLLM once the image is known (model/engine_args.py)
    checkpoint: CheckpointEntry = CheckpointEntry()
    container: ContainerEntry = ContainerEntry()
    env: Env = ()
    image: ImagePart = None
    shortlist: ShortlistEntry = ShortlistEntry()


# ------------------------------------------------------------------------------------------ facts file
# `plan --facts FILE` / `doctor --facts FILE`: what gather would read on each node (`model/facts_file.py`).
MAX_ITEMS = 256  # netdevs, RDMA devices and units a node may list in a facts file
MAX_MEMORY_GIB = 1 << 16  # 64 TiB: far above any node, far below a float that int() cannot hold
_GIB = 1 << 30


def _memory(unit: str, limit: float) -> Any:
    what = f"a number above 0 and at most {limit}"

    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
            raise bad(f"expected {what}, got {short(value)}")
        return value

    return Annotated[float, BeforeValidator(check), Field(description=f"{unit} of memory ({what})")]


def _word(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise bad(f"expected a string, got {short(value)}")
    return str(value)


def _ipv4s(value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or len(values) > MAX_ITEMS:
        raise bad(f"expected a list of at most {MAX_ITEMS} IPv4 addresses")
    for i, addr in enumerate(values):
        try:
            ipaddress.IPv4Interface(addr)
        except (ValueError, TypeError):
            raise bad(f"{short(addr)} is not an IPv4 address", at=f"[{i}]") from None
    return tuple(str(a) if "/" in str(a) else f"{a}/32" for a in values)


def _unit_names(values: list) -> None:
    if not all(isinstance(u, str) for u in values):
        raise bad(f"expected a list of at most {MAX_ITEMS} unit names")


Word = Annotated[str, BeforeValidator(_word), Field(description="a string")]


def _devices(entry: Any) -> Any:
    what = f"a mapping of at most {MAX_ITEMS} device names to their facts"

    def check(value: Any) -> Any:
        if not isinstance(value, dict) or len(value) > MAX_ITEMS:
            raise bad(f"expected {what}")
        for name in value:
            if not isinstance(name, str):
                raise bad(f"device names are strings, got {short(name)}")
        return {k: v if v is not None else {} for k, v in value.items()}

    return Annotated[dict[str, entry], BeforeValidator(check), Field(description=what)]


@section(kw_only=True)
class NetdevFacts:
    ipv4: Annotated[tuple[str, ...], BeforeValidator(_ipv4s), Field(description="a list of IPv4 addresses")] = ()
    mtu: Int(68, 65536) = None
    up: Flag = None


@section(kw_only=True)
class RoceFacts:
    netdev: Text("a netdev name") = None
    gid_index: Int(0, 255) = None
    port: Int(1, 255) = 1


@section(kw_only=True)
class NodeFactsEntry:
    """One node's facts; memory in GiB or in bytes, not both (mem_total is required)."""
    mem_total_gib: _memory("GiB", MAX_MEMORY_GIB) = None
    mem_total_bytes: _memory("bytes", MAX_MEMORY_GIB * _GIB) = None
    mem_available_gib: _memory("GiB", MAX_MEMORY_GIB) = None
    mem_available_bytes: _memory("bytes", MAX_MEMORY_GIB * _GIB) = None
    gpu_name: Word = None
    driver: Word = None
    docker_version: Word = None
    netdevs: _devices(NetdevFacts) = dataclasses.field(default_factory=dict)
    roce: _devices(RoceFacts) = dataclasses.field(default_factory=dict)
    units: Items(Any, MAX_ITEMS, f"a list of at most {MAX_ITEMS} unit names", check=_unit_names) = ()
    has_gpu: Flag = None

    @model_validator(mode="after")
    def _memory_once(self) -> "NodeFactsEntry":
        for key in ("mem_total", "mem_available"):
            if getattr(self, f"{key}_gib") is not None and getattr(self, f"{key}_bytes") is not None:
                raise bad(f"give {key}_gib or {key}_bytes, not both", at=f".{key}_gib")
        total, available = self.bytes("mem_total"), self.bytes("mem_available")
        if total is None:
            raise bad("missing; expected GiB of memory (a number)", at=".mem_total_gib")
        if available is not None and available > total:
            raise bad("larger than mem_total", at=".mem_available_gib")
        return self

    def bytes(self, key: str) -> int | None:
        gib, count = getattr(self, f"{key}_gib"), getattr(self, f"{key}_bytes")
        return int(gib * _GIB) if gib is not None else None if count is None else int(count)


@section
class FactsFile:
    nodes: Annotated[dict[str, NodeFactsEntry], Field(description="a mapping of node name: facts")]
