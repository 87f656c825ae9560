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
    image:      {base: REF@sha256:..., vllm_version: 0.33.0, local: false, repository: sparkdeploy/serving}
    patches:    {shortlist: true, skinny_gemm: true, fp8_gdn: true, prefix_align: true}
    vocab:      vocabs/x.txt            # draft vocab list, relative to this file; null only if shortlist is off
    ports:      {api: 8000, master: 29501}
    memory:     {reserve_gib: 28, gpu_memory_utilization: null}   # see memory.py
    speculative_tokens: 2               # optional override of the profile's MTP depth (0 = off)

The profile's `image:` block gives defaults (python, pip, and for the simulated profiles the base too) that
the inventory's `image:` overrides key by key.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sparkdeploy import checkpoint, credentials, engine_args, paths, sshconfig, yamlfile
from sparkdeploy.credentials import Auth
from sparkdeploy.errors import InventoryError, RemoteError
from sparkdeploy.layout import VOCAB_CONTAINER_DIR

FEATURES = ("shortlist", "skinny_gemm", "fp8_gdn", "prefix_align")
GPU_KINDS = ("gb10", "none")
ROLES = ("head", "worker")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")  # Linux IFNAMSIZ - 1
HCA_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252})$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([A-Za-z0-9._-]{0,40})$")  # part of the image tag: no '+'

SERVED_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
REPO_RE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_REF = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
DIGEST_REF_RE = re.compile(rf"^{_REF}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?@sha256:[0-9a-f]{{64}}$")
IMAGE_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG_REF_RE = re.compile(rf"^{_REF}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?$")
COMMAND_RE = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./ =-]*$")
SIZE_RE = re.compile(r"^[0-9]+[bkmg]?$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


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
    data_ip: str
    netdev: str
    hca: tuple[str, ...]
    gpu: str  # "gb10" | "none"

    @property
    def has_gpu(self) -> bool:
        return self.gpu != "none"


@dataclass(frozen=True)
class ImageConfig:
    base: str
    vllm_version: str
    local: bool = False
    repository: str = "sparkdeploy/serving"
    python: str = "python3"
    pip: str = "python3 -m pip"


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
    path: Path  # absolute host path of the source list (copied into the image and onto the nodes)
    sha256: str
    size: int  # number of ids


@dataclass(frozen=True)
class Ports:
    api: int = 8000
    master: int = 29501


@dataclass(frozen=True)
class MemoryConfig:
    reserve_gib: float = 28.0
    gpu_memory_utilization: float | None = None


@dataclass(frozen=True)
class Speculative:
    method: str  # "mtp" | "ngram" | ...
    num_speculative_tokens: int
    extra: tuple[tuple[str, Any], ...] = ()  # other keys of the speculative config, sorted

    def config(self) -> dict[str, Any] | None:
        """The `--speculative-config` dict, or None when speculation is off (depth 0)."""
        if self.num_speculative_tokens == 0:
            return None
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens, **dict(self.extra)}


@dataclass(frozen=True)
class Profile:
    name: str
    file: str
    model_id: str
    model_path: str  # path inside the container
    host_dir: str | None  # host directory bind-mounted read-only at model_path (None: baked into the image)
    served_name: str
    weights_gib: float  # whole checkpoint, split across tp x pp ranks
    kv_bytes_per_token: int  # per rank, at the profile's tp
    activation_gib: float
    tp: int
    pp: int
    dp: int
    expert_parallel: bool
    speculative: Speculative
    max_model_len: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    kv_cache_dtype: str | None
    enforce_eager: bool
    prefix_caching: bool
    gpus: bool
    rdma: bool
    shm_size: str
    caches: bool
    env: tuple[tuple[str, str], ...]
    engine_args: tuple[str, ...] = ()  # extra `vllm serve` argv, checked against the pinned vLLM (engine_args.py)
    checkpoint_format: str | None = None  # declared `checkpoint.format`; the head's files win when read

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


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

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


# ------------------------------------------------------------------------------------------- reading
class _Fields:
    """A mapping read field by field; remembers the path for messages and rejects keys never read."""

    def __init__(self, data: Any, path: str, file: str, *, allowed: tuple[str, ...]):
        self.file, self.path = file, path
        if not isinstance(data, dict):
            self.fail("", f"expected a mapping, got {_kind(data)}")
        for key in data:
            if not isinstance(key, str):
                self.fail("", f"keys must be strings, got {key!r}")
            if key not in allowed:
                hint = _suggest(key, allowed)
                self.fail(key, f"unknown key{hint}; allowed: {', '.join(allowed)}")
        self.data = data

    def at(self, key: str) -> str:
        if not key:
            return self.path or "(top level)"
        if key.startswith("["):
            return f"{self.path}{key}"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> None:
        raise InventoryError(message, file=self.file, field=self.at(key))

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str, kind: type | tuple, default: Any = ..., *, what: str | None = None) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                self.fail(key, f"missing; expected {what or _kind_name(kind)}")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.fail(key, f"expected {what or _kind_name(kind)}, got a boolean ({value!r})")
        if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            self.fail(key, f"expected {what or _kind_name(kind)}, got {_kind(value)} ({_short(value)})")
        if isinstance(value, str) and _CONTROL_RE.search(value):
            self.fail(key, "control characters (newline, tab, NUL...) are not allowed")
        return value

    def text(self, key: str, pattern: re.Pattern | None = None, default: Any = ..., *, what: str = "a string") -> Any:
        value = self.get(key, str, default, what=what)
        if value is default and default is not ...:
            return value
        if not value:
            self.fail(key, f"must not be empty; expected {what}")
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(key, f"{_short(value)} is not {what}")
        return value

    def integer(self, key: str, lo: int, hi: int, default: Any = ..., *, what: str | None = None) -> Any:
        value = self.get(key, int, default, what=what or f"an integer {lo}..{hi}")
        if value is default and default is not ...:
            return value
        if not lo <= value <= hi:
            self.fail(key, f"{value} out of range; expected {what or f'an integer {lo}..{hi}'}")
        return value

    def number(self, key: str, lo: float, hi: float, default: Any = ..., *, what: str) -> Any:
        value = self.get(key, float, default, what=what)
        if value is default and default is not ...:
            return value
        if not lo <= value <= hi:
            self.fail(key, f"{value} out of range; expected {what}")
        return value

    def flag(self, key: str, default: Any = ...) -> Any:
        return self.get(key, bool, default, what="true or false")

    def sub(self, key: str, allowed: tuple[str, ...], *, required: bool = True) -> "_Fields":
        if not self.has(key):
            if required:
                self.fail(key, f"missing; expected a mapping with keys {', '.join(allowed)}")
            return _Fields({}, self.at(key), self.file, allowed=allowed)
        return _Fields(self.data[key], self.at(key), self.file, allowed=allowed)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "nothing"}.get(type(value), type(value).__name__)


def _kind_name(kind: type | tuple) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a string", int: "an integer", float: "a number", bool: "true or false",
                        list: "a list", dict: "a mapping"}.get(k, k.__name__) for k in kinds)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _suggest(key: str, allowed: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _read_yaml(path: Path, what: str) -> Any:
    return yamlfile.load(path, what)


# ------------------------------------------------------------------------------------------- sections
_NODE_KEYS = ("name", "role", "ssh", "data_ip", "netdev", "hca", "gpu")
_SSH_KEYS = ("host", "user", "port", "key", "known_hosts")


def _path_text(f: _Fields, key: str, default: Any = ..., *, absolute: bool = False, mount: bool = False) -> Any:
    value = f.text(key, None, default, what="an absolute path" if absolute else "a path")
    if value is default and default is not ...:
        return value
    if absolute and not value.startswith("/"):
        f.fail(key, f"{value!r} is not an absolute path")
    if mount and any(ch in value for ch in ":,"):
        f.fail(key, f"{value!r}: a path mounted into the container cannot contain ':' or ','")
    return value


_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
# `render --out` writes these next to the per-node directories (render.py's layout): no node may be named so
_RENDER_TOP_LEVEL = ("plan.json", "image")
# host directories never handed to a container as a model directory (eviction reads every file under it)
_SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
                "/var")


def _model_path(m: _Fields) -> str:
    value = _path_text(m, "path", absolute=True, mount=True)
    path, vocab = posixpath.normpath(value), VOCAB_CONTAINER_DIR
    if path == "/" or path == vocab or path.startswith(vocab + "/") or vocab.startswith(path + "/"):
        m.fail("path", f"{_short(value)} overlaps {vocab}, where the container mounts the draft vocabulary; "
                       "expected a directory of its own, such as /models/<name>")
    return value


def _host_dir(m: _Fields) -> str | None:
    value = _path_text(m, "host_dir", None, absolute=True, mount=True)
    if value is not None and posixpath.normpath(value).replace("//", "/") in _SYSTEM_DIRS:
        m.fail("host_dir", f"{_short(value)} is a system directory; expected the directory that holds the "
                           "checkpoint, such as /srv/models/<name>")
    return value


def _node(raw: Any, index: int, file: str) -> Node:
    f = _Fields(raw, f"nodes[{index}]", file, allowed=_NODE_KEYS)
    name = f.text("name", NAME_RE, what="a node name (letters, digits, '.', '_', '-'; up to 63)")
    if name in _RENDER_TOP_LEVEL:
        f.fail("name", f"{name!r} is reserved (render writes {' and '.join(_RENDER_TOP_LEVEL)} beside the node "
                       "directories); choose another node name")
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
        key=_path_text(s, "key", None) or sshconfig.identity_of(cfg),
        known_hosts=_path_text(s, "known_hosts", None),
        proxy_jump=cfg.get("proxyjump"),
    )
    data_ip = f.text("data_ip", None, what="an IPv4 address")
    try:
        address = ipaddress.IPv4Address(data_ip)
    except ValueError:
        f.fail("data_ip", f"{_short(data_ip)} is not an IPv4 address")
    if address.is_unspecified or address.is_loopback or address.is_multicast or address == _BROADCAST:
        f.fail("data_ip", f"{address} is not a node's own address; expected the IPv4 address of this node on the "
                          "data network (the other ranks connect to it), not 0.0.0.0, loopback, multicast or broadcast")
    data_ip = str(address)
    netdev = f.text("netdev", IFNAME_RE, what="a network interface name (1-15 of letters, digits, '.', '_', '-')")
    hca_raw = f.get("hca", list, [], what="a list of RoCE device names")
    hca: list[str] = []
    for i, dev in enumerate(hca_raw):
        if not isinstance(dev, str) or not HCA_RE.fullmatch(dev):
            f.fail(f"hca[{i}]", f"{_short(dev)} is not a RoCE device name")
        if dev in hca:
            f.fail(f"hca[{i}]", f"{dev!r} listed twice")
        hca.append(dev)
    gpu = f.text("gpu", None, "gb10", what="gb10 or none")
    if gpu not in GPU_KINDS:
        f.fail("gpu", f"{gpu!r} is not one of {', '.join(GPU_KINDS)}")
    return Node(name=name, role=role, ssh=ssh, data_ip=data_ip, netdev=netdev, hca=tuple(hca), gpu=gpu)


_IMAGE_KEYS = ("base", "vllm_version", "local", "repository", "python", "pip")


def _image_part(raw: Any, path: str, file: str) -> dict[str, Any]:
    f = _Fields(raw if raw is not None else {}, path, file, allowed=_IMAGE_KEYS)
    out: dict[str, Any] = {}
    if f.has("base"):
        out["base"] = (f.text("base", None, what="an image reference"), file, f.at("base"))
    if f.has("vllm_version"):
        version = f.get("vllm_version", (str, float), what="a vLLM version such as 0.33.0")
        version = str(version)
        if not VERSION_RE.fullmatch(version):
            f.fail("vllm_version", f"{_short(version)} is not a version such as 0.33.0 (digits, then letters, digits, "
                                   "'.', '_', '-': it becomes part of the image tag, so no '+')")
        out["vllm_version"] = version
    if f.has("local"):
        out["local"] = f.flag("local")
    if f.has("repository"):
        out["repository"] = f.text("repository", REPO_RE, what="an image repository name (lowercase)")
    for key in ("python", "pip"):
        if f.has(key):
            out[key] = f.text(key, COMMAND_RE, what="a command (letters, digits, '_./=-' and spaces)")
    return out


def _image(profile_part: dict[str, Any], inv_part: dict[str, Any], file: str) -> ImageConfig:
    merged = {**profile_part, **inv_part}
    for key in ("base", "vllm_version"):
        if key not in merged:
            raise InventoryError(f"missing; the inventory (or its profile) must set image.{key}", file=file,
                                 field=f"image.{key}")
    base, base_file, base_field = merged["base"]
    local = merged.get("local", False)
    if not (DIGEST_REF_RE.fullmatch(base) or IMAGE_ID_RE.fullmatch(base)):
        if not (local and TAG_REF_RE.fullmatch(base)):
            expected = ("an image reference pinned by digest (name@sha256:<64 hex>), an image ID (sha256:<64 hex>)"
                        ", or with image.local: true a local tag")
            raise InventoryError(f"{_short(base)} is not pinned; expected {expected}", file=base_file,
                                 field=base_field)
    return ImageConfig(base=base, vllm_version=merged["vllm_version"], local=local,
                       repository=merged.get("repository", "sparkdeploy/serving"),
                       python=merged.get("python", "python3"), pip=merged.get("pip", "python3 -m pip"))


_PROFILE_KEYS = ("description", "model", "parallel", "speculative", "engine", "engine_args", "checkpoint",
                 "container", "env", "image")
_MODEL_KEYS = ("id", "path", "host_dir", "served_name", "weights_gib", "kv_bytes_per_token")
_PARALLEL_KEYS = ("tp", "pp", "dp", "expert_parallel")
_ENGINE_KEYS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager",
                "prefix_caching", "activation_gib")
_CONTAINER_KEYS = ("gpus", "rdma", "shm_size", "caches")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")


def _speculative(raw: Any, path: str, file: str) -> Speculative:
    if raw is None:
        return Speculative(method="mtp", num_speculative_tokens=0)
    f = _Fields(raw, path, file, allowed=tuple(raw) if isinstance(raw, dict) else ())
    method = f.text("method", re.compile(r"^[a-z0-9_]+$"), what="a speculative method (mtp, ngram, ...)")
    depth = f.integer("num_speculative_tokens", 0, 8, what="an integer 0..8 (0 = off)")
    extra = []
    for key in sorted(f.data):
        if key in ("method", "num_speculative_tokens"):
            continue
        value = f.get(key, (str, int, float, bool), what="a string, number or boolean")
        extra.append((key, value))
    return Speculative(method=method, num_speculative_tokens=depth, extra=tuple(extra))


def _env(raw: Any, path: str, file: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise InventoryError(f"expected a mapping of NAME: value, got {_kind(raw)}", file=file, field=path)
    out = []
    for key in sorted(raw, key=str):
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise InventoryError(f"{_short(key)} is not an environment variable name", file=file, field=path)
        value = raw[key]
        if isinstance(value, bool):
            value = "1" if value else "0"
        if not isinstance(value, (str, int, float)):
            raise InventoryError(f"expected a string or number, got {_kind(value)}", file=file,
                                 field=f"{path}.{key}")
        value = str(value)
        if _CONTROL_RE.search(value):
            raise InventoryError("control characters (newline, tab, NUL...) are not allowed", file=file,
                                 field=f"{path}.{key}")
        out.append((key, value))
    return tuple(out)


def _profile_path(ref: str, inventory_file: Path) -> Path:
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        candidate = Path(ref)
        return candidate if candidate.is_absolute() else inventory_file.parent / candidate
    return paths.profiles_dir() / f"{ref}.yaml"


def load_profile(path: Path, name: str | None = None) -> tuple[Profile, dict[str, Any], Any]:
    """Read a model profile; return it, its `image:` defaults (merged with the inventory's by `load`) and its raw
    `engine_args` (checked by `load` once the merged image says which vLLM they are for)."""
    file = str(path)
    raw = _read_yaml(path, "profile")
    f = _Fields(raw, "", file, allowed=_PROFILE_KEYS)
    f.get("description", str, "")
    m = f.sub("model", _MODEL_KEYS)
    p = f.sub("parallel", _PARALLEL_KEYS)
    e = f.sub("engine", _ENGINE_KEYS)
    c = f.sub("container", _CONTAINER_KEYS, required=False)
    shm = c.text("shm_size", SIZE_RE, "16g", what="a size such as 16g")
    ck = f.sub("checkpoint", ("format",), required=False)
    ck_format = ck.text("format", None, None, what=f"a checkpoint format ({', '.join(checkpoint.KNOWN_FORMATS)})")
    if ck_format is not None and ck_format not in checkpoint.KNOWN_FORMATS:
        ck.fail("format", f"{_short(ck_format)} is not one of {', '.join(checkpoint.KNOWN_FORMATS)}")
    kv_dtype = e.text("kv_cache_dtype", None, None, what=f"one of {', '.join(KV_DTYPES)}")
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        e.fail("kv_cache_dtype", f"{kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
    profile = Profile(
        name=name or path.stem,
        file=file,
        model_id=m.text("id", None, what="a model id"),
        model_path=_model_path(m),
        host_dir=_host_dir(m),
        served_name=m.text("served_name", SERVED_RE, what="a served model name"),
        weights_gib=m.number("weights_gib", 0.0, 4096.0, 0.0, what="GiB of weights, 0..4096"),
        kv_bytes_per_token=m.integer("kv_bytes_per_token", 0, 1 << 30, 0),
        activation_gib=e.number("activation_gib", 0.0, 1024.0, 2.0, what="GiB, 0..1024"),
        tp=p.integer("tp", 1, 64, 1),
        pp=p.integer("pp", 1, 64, 1),
        dp=p.integer("dp", 1, 64, 1),
        expert_parallel=p.flag("expert_parallel", False),
        speculative=_speculative(raw.get("speculative"), "speculative", file),
        max_model_len=e.integer("max_model_len", 16, 1 << 24),
        max_num_seqs=e.integer("max_num_seqs", 1, 4096, None),
        max_num_batched_tokens=e.integer("max_num_batched_tokens", 16, 1 << 24, None),
        kv_cache_dtype=kv_dtype,
        enforce_eager=e.flag("enforce_eager", False),
        prefix_caching=e.flag("prefix_caching", True),
        gpus=c.flag("gpus", True),
        rdma=c.flag("rdma", True),
        shm_size=shm,
        caches=c.flag("caches", True),
        env=_env(raw.get("env"), "env", file),
        checkpoint_format=ck_format,
    )
    image = _image_part(raw.get("image"), "image", file)
    return profile, image, raw.get("engine_args")


# ------------------------------------------------------------------------------------------------ load
_TOP_KEYS = ("cluster", "profile", "nodes", "image", "patches", "vocab", "ports", "memory", "speculative_tokens",
             "auth")


def _auth(f: _Fields, inventory_file: Path) -> Auth:
    """Secret files are local paths (`~` expanded, relative to the inventory), read now so a bad one exits 2."""
    a = f.sub("auth", ("api_key_file", "hf_token_file"), required=False)
    found: dict[str, Path] = {}
    for key in ("api_key_file", "hf_token_file"):
        ref = _path_text(a, key, None)
        if ref is None:
            continue
        path = Path(os.path.expandvars(ref)).expanduser()
        path = path if path.is_absolute() else inventory_file.parent / path
        try:
            credentials.read_secret(path, a.at(key))
        except InventoryError as err:
            raise InventoryError(err.reason, file=str(inventory_file), field=a.at(key)) from None
        found[key] = path
    return Auth(**found)


def _vocab(f: _Fields, inventory_file: Path, required: bool, vocab_size: int | None) -> Vocab | None:
    """The draft list, read by the one reader the engine uses (spark_overlays.vocab_list: format, bounds,
    sorted, unique) and checked against the served tokenizer's vocabulary size when it is recorded."""
    from spark_overlays import vocab_list

    if not f.has("vocab"):
        if required:
            f.fail("vocab", "missing; patches.shortlist is on, so a draft vocab list (one id per line) is needed")
        return None
    ref = _path_text(f, "vocab")
    path = Path(ref).expanduser()
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


def load(path: str | Path) -> Inventory:
    """Read, validate and type an inventory and its profile; raise InventoryError naming file and field."""
    inventory_file = Path(path)
    file = str(inventory_file)
    raw = _read_yaml(inventory_file, "inventory")
    f = _Fields(raw, "", file, allowed=_TOP_KEYS)
    cluster = f.text("cluster", NAME_RE, "sparkdeploy", what="a cluster name (letters, digits, '.', '_', '-')")

    nodes_raw = f.get("nodes", list, what="a list of nodes")
    if not nodes_raw:
        f.fail("nodes", "must list at least one node")
    nodes = tuple(_node(raw_node, i, file) for i, raw_node in enumerate(nodes_raw))
    _check_unique(nodes, file)
    heads = [i for i, n in enumerate(nodes) if n.role == "head"]
    if len(heads) != 1:
        where = "nodes" if not heads else f"nodes[{heads[1]}].role"
        raise InventoryError(f"exactly one node must have role: head, found {len(heads)}", file=file, field=where)

    profile_ref = f.text("profile", re.compile(r"^[A-Za-z0-9_./-]+$"), what="a profile name or path")
    if len(profile_ref) > 1024 or any(len(part) > 250 for part in profile_ref.split("/")):
        f.fail("profile", "too long; expected a profile name or path (at most 250 characters per path component)")
    profile_path = _profile_path(profile_ref, inventory_file)
    if not profile_path.is_file():
        available = sorted(p.stem for p in paths.profiles_dir().glob("*.yaml")) if paths.profiles_dir().is_dir() else []
        f.fail("profile", f"no profile {profile_ref!r} ({profile_path}); available: {', '.join(available) or 'none'}")
    profile, profile_image, raw_engine_args = load_profile(profile_path, name=profile_path.stem)

    pt = f.sub("patches", FEATURES, required=False)
    patches = Patches(**{feat: pt.flag(feat, True) for feat in FEATURES})

    depth = f.integer("speculative_tokens", 0, 8, None, what="an integer 0..8 (MTP depth; 0 = off)")
    if depth is not None:
        spec = profile.speculative
        profile = _replace(profile, speculative=Speculative(spec.method, depth, spec.extra))

    image = _image(profile_image, _image_part(raw.get("image"), "image", file), file)
    profile = _replace(profile, engine_args=engine_args.to_argv(raw_engine_args, _series(image, file),
                                                                file=profile.file))

    po = f.sub("ports", ("api", "master"), required=False)
    ports = Ports(api=po.integer("api", 1, 65535, 8000, what="a port 1..65535"),
                  master=po.integer("master", 1, 65535, 29501, what="a port 1..65535"))
    if ports.api == ports.master:
        po.fail("master", f"must differ from ports.api ({ports.api})")

    me = f.sub("memory", ("reserve_gib", "gpu_memory_utilization"), required=False)
    memory = MemoryConfig(
        reserve_gib=me.number("reserve_gib", 1.0, 512.0, 28.0, what="GiB kept for the host, 1..512"),
        gpu_memory_utilization=me.number("gpu_memory_utilization", 0.05, 0.99, None,
                                         what="a fraction 0.05..0.99 (or null to derive it)"),
    )

    if len(nodes) > 1 and profile.world_size != len(nodes):  # one node listed: the single-box layout
        raise InventoryError(
            f"profile {profile.name!r} needs tp x pp x dp = {profile.tp} x {profile.pp} x {profile.dp} = "
            f"{profile.world_size} node(s) (one GPU each) but the inventory lists {len(nodes)} (1 = single box)",
            file=file, field="nodes")
    if any(n.has_gpu for n in nodes) != all(n.has_gpu for n in nodes):
        raise InventoryError("mixing gpu: none and GPU nodes is not supported", file=file, field="nodes")
    if nodes[0].has_gpu != profile.gpus:
        kind = "GPU" if profile.gpus else "CPU (gpu: none)"
        raise InventoryError(f"profile {profile.name!r} is for {kind} nodes but nodes[0].gpu is {nodes[0].gpu}",
                             file=file, field="nodes[0].gpu")

    from sparkdeploy.served_tokenizer import known_vocab_size

    vocab = _vocab(f, inventory_file, required=patches.shortlist, vocab_size=known_vocab_size(profile.model_id))
    return Inventory(file=file, cluster=cluster, nodes=nodes, profile=profile, image=image, patches=patches,
                     vocab=vocab, ports=ports, memory=memory, auth=_auth(f, inventory_file))


def _series(image: ImageConfig, file: str) -> str:
    from spark_overlays import compat

    try:
        return compat.series(image.vllm_version)
    except compat.CompatError as err:
        raise InventoryError(str(err), file=file, field="image.vllm_version") from None


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def _check_unique(nodes: tuple[Node, ...], file: str) -> None:
    checks: list[tuple[str, Callable[[Node], Any]]] = [
        ("name", lambda n: n.name), ("data_ip", lambda n: n.data_ip), ("ssh.host", lambda n: (n.ssh.host, n.ssh.port)),
    ]
    for field, key in checks:
        seen: dict[Any, int] = {}
        for i, node in enumerate(nodes):
            value = key(node)
            if value in seen:
                raise InventoryError(f"duplicate of nodes[{seen[value]}].{field} ({_short(value)})", file=file,
                                     field=f"nodes[{i}].{field}")
            seen[value] = i
