"""Parse ``additional_config["spark_overlays"]`` (pure: no vllm/torch import).

Schema (every key optional; a feature without ``enabled: true`` is off)::

    {"spark_overlays": {
        "shortlist":    {"enabled": true, "path": "/opt/sparkdeploy/vocab/current.txt",
                         "sha256": "<hex of the file bytes>", "require_ids": [0, 1, 2], "force": false,
                         "capacity": 65536, "live_check_every": 64},
        "skinny_gemm":  {"enabled": true, "plans": "auto", "force": false},
        "fp8_gdn":      {"enabled": false},
        "prefix_align": {"enabled": false},
        "capture":      {"enabled": true, "path": "/var/lib/sparkdeploy/capture/counts.npy",
                         "switch": "/var/lib/sparkdeploy/capture/on",
                         "flush_seconds": 60, "flush_tokens": 1000000}
    }}

``fp8_gdn`` and ``prefix_align`` are native vLLM flags on every supported pin (``compat.py``): the plugin
has no code for them and accepts only ``enabled`` so the planner can render every feature the same way.

Unknown features or keys are errors: the feature they belong to fails closed (stays stock) with the
reason logged, so a typo never silently changes behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROOT_KEY = "spark_overlays"


class SettingsError(ValueError):
    """A malformed spark_overlays setting; the message names the key path."""


@dataclass(frozen=True)
class Shortlist:
    enabled: bool = False
    path: str = ""
    sha256: str | None = None
    require_ids: tuple[int, ...] = ()
    force: bool = False  # run even where a behaviour probe could not run on this vLLM (``probes``)
    capacity: int = 0  # rows of the draft head, fixed at start: the largest list a live swap may bring (0: the list's)
    live_check_every: int = 0  # drafter calls between looks at the list pointer (0: no live swap)


@dataclass(frozen=True)
class SkinnyGemm:
    enabled: bool = False
    plans: str = "auto"  # on a pin with its own plan table: "auto" adds only measured entries, "all" every one
    force: bool = False


@dataclass(frozen=True)
class NativeFeature:
    """A feature vLLM does with its own flags: nothing here acts on it."""

    enabled: bool = False


@dataclass(frozen=True)
class Capture:
    """Counts of emitted token ids (``capture.py``): the counts file and how often it is rewritten."""

    enabled: bool = False
    path: str = ""
    switch: str = ""  # a file whose presence turns counting on at run time ("": counting from the start)
    flush_seconds: float = 60.0
    flush_tokens: int = 1_000_000


@dataclass(frozen=True)
class Settings:
    shortlist: Shortlist = field(default_factory=Shortlist)
    skinny_gemm: SkinnyGemm = field(default_factory=SkinnyGemm)
    fp8_gdn: NativeFeature = field(default_factory=NativeFeature)
    prefix_align: NativeFeature = field(default_factory=NativeFeature)
    capture: Capture = field(default_factory=Capture)


_KEYS = {
    "shortlist": {"enabled": bool, "path": str, "sha256": (str, type(None)), "require_ids": list, "force": bool,
                  "capacity": int, "live_check_every": int},
    "skinny_gemm": {"enabled": bool, "plans": str, "force": bool},
    "fp8_gdn": {"enabled": bool},
    "prefix_align": {"enabled": bool},
    "capture": {"enabled": bool, "path": str, "switch": str, "flush_seconds": (int, float), "flush_tokens": int},
}
_CLASSES = {"shortlist": Shortlist, "skinny_gemm": SkinnyGemm, "fp8_gdn": NativeFeature, "prefix_align": NativeFeature,
            "capture": Capture}


def _feature(name: str, raw: Any) -> Any:
    where = f"additional_config.{ROOT_KEY}.{name}"
    if not isinstance(raw, dict):
        raise SettingsError(f"{where} must be an object, got {type(raw).__name__}")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _KEYS[name]:
            raise SettingsError(f"{where}.{key} is not a known key (known: {', '.join(_KEYS[name])})")
        want = _KEYS[name][key]
        wants = want if isinstance(want, tuple) else (want,)
        if isinstance(value, bool) and bool not in wants:
            raise SettingsError(f"{where}.{key} must be an integer, got a boolean")
        if not isinstance(value, want):
            raise SettingsError(f"{where}.{key} has the wrong type ({type(value).__name__})")
        kwargs[key] = value
    if "require_ids" in kwargs:
        ids = kwargs["require_ids"]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise SettingsError(f"{where}.require_ids must be non-negative integers")
        kwargs["require_ids"] = tuple(ids)
    for key in ("capacity", "live_check_every"):
        if key in kwargs and kwargs[key] < 0:
            raise SettingsError(f"{where}.{key} must be 0 or more, got {kwargs[key]}")
    for key in ("flush_seconds", "flush_tokens"):
        if key in kwargs and not kwargs[key] > 0:
            raise SettingsError(f"{where}.{key} must be positive, got {kwargs[key]}")
    if kwargs.get("plans", "auto") not in ("auto", "all"):
        raise SettingsError(f"{where}.plans must be 'auto' (measured entries only) or 'all', got {kwargs['plans']!r}")
    out = _CLASSES[name](**kwargs)
    if name in ("shortlist", "capture") and out.enabled and not out.path:
        raise SettingsError(f"{where}.path is required when enabled")
    return out


def parse_feature(additional_config: Any, name: str) -> Any:
    """The settings object for one feature; raises :class:`SettingsError` naming the bad key."""
    if name not in _KEYS:
        raise SettingsError(f"unknown spark_overlays feature {name!r}")
    root = (additional_config or {}).get(ROOT_KEY) if isinstance(additional_config, dict) else None
    if root is None:
        return _CLASSES[name]()
    if not isinstance(root, dict):
        raise SettingsError(f"additional_config.{ROOT_KEY} must be an object")
    unknown = sorted(set(root) - set(_KEYS))
    if unknown:
        raise SettingsError(f"additional_config.{ROOT_KEY}.{unknown[0]} is not a known feature")
    return _feature(name, root.get(name, {}))


PROBED = ("shortlist", "skinny_gemm")  # features whose decision ``probes`` runs on the installed vLLM


def switched_on(additional_config: Any, name: str) -> Any | None:
    """The feature's settings when it is on, else None. A bad setting switches it off (fail closed, logged), and
    so does a behaviour probe that drifted or could not run (unless ``force``): every process that loads the
    plugin parses the same config and reads the same vLLM files, so all of them agree."""
    from ._util import fail_closed

    try:
        cfg = parse_feature(additional_config, name)
    except SettingsError as e:
        fail_closed(name, str(e))
        return None
    if not cfg.enabled:
        return None
    if name in PROBED:
        from . import probes

        why = probes.installed_gate(name, cfg.force)
        if why:
            fail_closed(name, why)
            return None
    return cfg


def parse(additional_config: Any) -> Settings:
    """Every feature at once (raises on the first bad key)."""
    return Settings(**{name: parse_feature(additional_config, name) for name in _KEYS})


def additional_config(**features: dict) -> dict:
    """Build the ``--additional-config`` dict the planner renders, validating it on the way."""
    cfg = {ROOT_KEY: features}
    parse(cfg)
    return cfg
