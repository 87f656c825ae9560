"""Load and validate a model profile (`deploy/profiles/<name>.yaml`): the model, its parallel layout, engine
settings, container needs, env and `image:` defaults, into an immutable `Profile`. The inventory names one
(`inventory.load` reads it and merges its `image:` defaults with the inventory's, key by key)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkdeploy import paths, yamlfile
from sparkdeploy.errors import InventoryError
from sparkdeploy.model.fields import read, short
from sparkdeploy.model.schema import Env, ImagePart, ProfileFile

_REF = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
DIGEST_REF_RE = re.compile(rf"^{_REF}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?@sha256:[0-9a-f]{{64}}$")
IMAGE_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG_REF_RE = re.compile(rf"^{_REF}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?$")


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


def env_items(raw: Any, path: str, file: str) -> tuple[tuple[str, str], ...]:
    """A container env as a profile takes it (recipe import checks one before it writes a profile)."""
    return () if raw is None else read(Env, raw, path, file)


def image_part(part: ImagePart | None, file: str, path: str) -> dict[str, Any]:
    """The keys an `image:` block sets (the profile's, the inventory's or a service's); `base` keeps where it was
    set, for the error if it is not pinned."""
    out = part.present() if part is not None else {}
    if "base" in out:
        out["base"] = (out["base"], file, f"{path}.base")
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
    f = read(ProfileFile, yamlfile.load(path, "profile"), "", file)
    m, p, e, c = f.model, f.parallel, f.engine, f.container
    spec = dict(f.speculative or (("method", "mtp"), ("num_speculative_tokens", 0)))
    profile = Profile(
        name=name or path.stem,
        file=file,
        model_id=m.id,
        model_path=m.path,
        host_dir=m.host_dir,
        served_name=m.served_name,
        weights_gib=m.weights_gib,
        kv_bytes_per_token=m.kv_bytes_per_token,
        activation_gib=e.activation_gib,
        tp=p.tp,
        pp=p.pp,
        dp=p.dp,
        expert_parallel=p.expert_parallel,
        speculative=Speculative(spec.pop("method"), spec.pop("num_speculative_tokens"), tuple(sorted(spec.items()))),
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        kv_cache_dtype=e.kv_cache_dtype,
        enforce_eager=e.enforce_eager,
        prefix_caching=e.prefix_caching,
        gpus=c.gpus,
        rdma=c.rdma,
        shm_size=c.shm_size,
        caches=c.caches,
        env=f.env,
        checkpoint_format=f.checkpoint.format,
        shortlist_capacity=f.shortlist.capacity,
        shortlist_live_check_every=f.shortlist.live_check_every,
    )
    return profile, image_part(f.image, file, "image"), f.engine_args
