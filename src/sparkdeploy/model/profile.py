"""Load and validate a model profile (`deploy/profiles/<name>.yaml`): the model, its parallel layout, engine
settings, container needs, env and `image:` defaults, into an immutable `Profile`. The inventory names one
(`inventory.load` reads it and merges its `image:` defaults with the inventory's, key by key)."""

from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdeploy import paths, yamlfile
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import checkpoint
from sparkdeploy.model.fields import CONTROL_RE, Fields, kind_of, path_text, short
from sparkdeploy.node.layout import STATE_DIR, VOCAB_CONTAINER_DIR

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


@dataclass(frozen=True)
class ImageConfig:
    base: str
    vllm_version: str
    local: bool = False
    repository: str = "sparkdeploy/serving"
    python: str = "python3"
    pip: str = "python3 -m pip"


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
    engine_args: tuple[str, ...] = ()  # extra `vllm serve` argv, checked against the pinned vLLM (model/engine_args.py)
    checkpoint_format: str | None = None  # declared `checkpoint.format`; the head's files win when read
    # the shortlisted draft head's rows, fixed at start: the largest list a live swap may bring (None: the list's)
    shortlist_capacity: int | None = None
    shortlist_live_check_every: int = 0  # drafter calls between the engine's looks at the list pointer (0: no live swap)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


# Host directories never taken as a model directory: eviction reads every file under it and `weights sync`
# writes the head's files into it on every worker. The trees are refused with everything below them (except the
# kit's own model store), the tops of user trees only as themselves, and any .ssh directory anywhere.
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                 "/sys", "/usr", "/var/lib", "/var/log", "/var/run", "/var/spool", "/var/cache")
_SYSTEM_TOPS = ("/", "/var", "/home", "/root", "/opt", "/srv", "/mnt", "/media", "/tmp")
MODEL_STORE = f"{STATE_DIR}/models"  # the shipped profiles' host_dir parent: /var/lib/sparkdeploy/models/<name>


def _model_path(m: Fields) -> str:
    value = path_text(m, "path", absolute=True, mount=True)
    path, vocab = posixpath.normpath(value), VOCAB_CONTAINER_DIR
    if path == "/" or path == vocab or path.startswith(vocab + "/") or vocab.startswith(path + "/"):
        m.fail("path", f"{short(value)} overlaps {vocab}, where the container mounts the draft vocabulary; "
                       "expected a directory of its own, such as /models/<name>")
    return value


def _host_dir(m: Fields) -> str | None:
    value = path_text(m, "host_dir", None, absolute=True, mount=True)
    if value is not None and _system_dir(value):
        m.fail("host_dir", f"{short(value)} is a system directory or lies below one; expected the directory that "
                           f"holds the checkpoint, such as /srv/models/<name> or {MODEL_STORE}/<name>")
    return value


def _system_dir(value: str) -> bool:
    path = "/" + posixpath.normpath(value).lstrip("/")
    if path.startswith(MODEL_STORE + "/"):
        return False
    return (path in _SYSTEM_TOPS or ".ssh" in path.split("/")
            or any(path == tree or path.startswith(tree + "/") for tree in _SYSTEM_TREES))


_IMAGE_KEYS = ("base", "vllm_version", "local", "repository", "python", "pip")


def image_part(raw: Any, path: str, file: str) -> dict[str, Any]:
    f = Fields(raw if raw is not None else {}, path, file, allowed=_IMAGE_KEYS)
    out: dict[str, Any] = {}
    if f.has("base"):
        out["base"] = (f.text("base", None, what="an image reference"), file, f.at("base"))
    if f.has("vllm_version"):
        version = f.get("vllm_version", (str, float), what="a vLLM version such as 0.33.0")
        version = str(version)
        if not VERSION_RE.fullmatch(version):
            f.fail("vllm_version", f"{short(version)} is not a version such as 0.33.0 (digits, then letters, digits, "
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


def image_config(profile_part: dict[str, Any], inv_part: dict[str, Any], file: str, path: str = "image") -> ImageConfig:
    merged = {**profile_part, **inv_part}
    for key in ("base", "vllm_version"):
        if key not in merged:
            raise InventoryError(f"missing; the inventory (or its profile) must set image.{key}", file=file,
                                 field=f"{path}.{key}")
    base, base_file, base_field = merged["base"]
    local = merged.get("local", False)
    if not (DIGEST_REF_RE.fullmatch(base) or IMAGE_ID_RE.fullmatch(base)):
        if not (local and TAG_REF_RE.fullmatch(base)):
            expected = ("an image reference pinned by digest (name@sha256:<64 hex>), an image ID (sha256:<64 hex>)"
                        ", or with image.local: true a local tag")
            raise InventoryError(f"{short(base)} is not pinned; expected {expected}", file=base_file,
                                 field=base_field)
    return ImageConfig(base=base, vllm_version=merged["vllm_version"], local=local,
                       repository=merged.get("repository", "sparkdeploy/serving"),
                       python=merged.get("python", "python3"), pip=merged.get("pip", "python3 -m pip"))


_PROFILE_KEYS = ("description", "model", "parallel", "speculative", "engine", "engine_args", "checkpoint",
                 "container", "env", "image", "shortlist")
_SHORTLIST_KEYS = ("capacity", "live_check_every")
_MODEL_KEYS = ("id", "path", "host_dir", "served_name", "weights_gib", "kv_bytes_per_token")
_PARALLEL_KEYS = ("tp", "pp", "dp", "expert_parallel")
_ENGINE_KEYS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager",
                "prefix_caching", "activation_gib")
_CONTAINER_KEYS = ("gpus", "rdma", "shm_size", "caches")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")


def _speculative(raw: Any, path: str, file: str) -> Speculative:
    if raw is None:
        return Speculative(method="mtp", num_speculative_tokens=0)
    f = Fields(raw, path, file, allowed=tuple(raw) if isinstance(raw, dict) else ())
    method = f.text("method", re.compile(r"^[a-z0-9_]+$"), what="a speculative method (mtp, ngram, ...)")
    depth = f.integer("num_speculative_tokens", 0, 8, what="an integer 0..8 (0 = off)")
    extra = []
    for key in sorted(f.data):
        if key in ("method", "num_speculative_tokens"):
            continue
        value = f.get(key, (str, int, float, bool), what="a string, number or boolean")
        if isinstance(value, float) and not math.isfinite(value):
            f.fail(key, f"{value} is not a number vLLM's JSON config takes")
        extra.append((key, value))
    return Speculative(method=method, num_speculative_tokens=depth, extra=tuple(extra))


# Names that hold a secret: a profile's env lands in a 0644 engine.env, `plan` output and the release id.
SECRET_ENV_RE = re.compile(r"VLLM_API_KEY|HF_TOKEN|.*_TOKEN|.*_KEY|.*SECRET.*|.*PASSWORD.*", re.IGNORECASE)


def env_items(raw: Any, path: str, file: str) -> tuple[tuple[str, str], ...]:
    """The container env; secret-like names are refused (their place is the inventory's `auth:`, a 0600 file)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise InventoryError(f"expected a mapping of NAME: value, got {kind_of(raw)}", file=file, field=path)
    out = []
    for key in sorted(raw, key=str):
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise InventoryError(f"{short(key)} is not an environment variable name", file=file, field=path)
        if SECRET_ENV_RE.fullmatch(key):
            raise InventoryError("looks like a secret, and a profile's env is written in clear to engine.env, the "
                                 "plan and the release id; give the API key as auth.api_key_file and the Hugging "
                                 "Face token as auth.hf_token_file in the inventory (0600 files)",
                                 file=file, field=f"{path}.{key}")
        value = raw[key]
        if isinstance(value, bool):
            value = "1" if value else "0"
        if not isinstance(value, (str, int, float)):
            raise InventoryError(f"expected a string or number, got {kind_of(value)}", file=file,
                                 field=f"{path}.{key}")
        value = str(value)
        if CONTROL_RE.search(value):
            raise InventoryError("control characters (newline, tab, NUL...) are not allowed", file=file,
                                 field=f"{path}.{key}")
        out.append((key, value))
    return tuple(out)


def find_profile(ref: str, inventory_file: Path) -> Path:
    """A profile named by the inventory: a path (relative to the inventory) or a shipped profile name."""
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        candidate = Path(ref)
        return candidate if candidate.is_absolute() else inventory_file.parent / candidate
    return paths.profiles_dir() / f"{ref}.yaml"


def load_profile(path: Path, name: str | None = None) -> tuple[Profile, dict[str, Any], Any]:
    """Read a model profile; return it, its `image:` defaults (merged with the inventory's by `load`) and its raw
    `engine_args` (checked by `load` once the merged image says which vLLM they are for)."""
    file = str(path)
    raw = yamlfile.load(path, "profile")
    f = Fields(raw, "", file, allowed=_PROFILE_KEYS)
    f.get("description", str, "")
    m = f.sub("model", _MODEL_KEYS)
    p = f.sub("parallel", _PARALLEL_KEYS)
    e = f.sub("engine", _ENGINE_KEYS)
    c = f.sub("container", _CONTAINER_KEYS, required=False)
    shm = c.text("shm_size", SIZE_RE, "16g", what="a size such as 16g")
    ck = f.sub("checkpoint", ("format",), required=False)
    ck_format = ck.text("format", None, None, what=f"a checkpoint format ({', '.join(checkpoint.KNOWN_FORMATS)})")
    if ck_format is not None and ck_format not in checkpoint.KNOWN_FORMATS:
        ck.fail("format", f"{short(ck_format)} is not one of {', '.join(checkpoint.KNOWN_FORMATS)}")
    sl = f.sub("shortlist", _SHORTLIST_KEYS, required=False)
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
        env=env_items(raw.get("env"), "env", file),
        checkpoint_format=ck_format,
        shortlist_capacity=sl.integer("capacity", 1, 1 << 24, None, what="draft head rows, 1..16777216"),
        shortlist_live_check_every=sl.integer("live_check_every", 0, 1 << 20, 0,
                                              what="drafter calls between pointer checks, 0..1048576 (0 = off)"),
    )
    image = image_part(raw.get("image"), "image", file)
    return profile, image, raw.get("engine_args")
