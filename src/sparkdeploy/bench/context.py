"""What a results file records about the thing measured, so two runs can be compared honestly.

Sources, in order of what they can know:
  - the URL alone: only what the API says (model, vLLM version; done by `client.discover`);
  - an inventory: the head node's API address, the release/image/vocab/patch settings it asks for, the nodes;
  - the live release on the nodes (what is actually deployed): read through `LIVE_RELEASE_READER`, a seam the
    orchestration layer fills in (`set_live_release_reader(fn)`, fn(inventory) -> dict); until it does, the
    inventory's *desired* values are recorded and marked as such.
Every field is optional; an unknown value is absent, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkdeploy.errors import BenchError, SparkdeployError

LIVE_RELEASE_READER: Callable[[Any], dict] | None = None


def set_live_release_reader(fn: Callable[[Any], dict] | None) -> None:
    """Called by the orchestration layer to let bench record the release actually running on the nodes."""
    global LIVE_RELEASE_READER
    LIVE_RELEASE_READER = fn


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


def _plain(value: Any) -> Any:
    """JSON-able copy of dataclasses / objects / paths (facts and inventories are dataclasses)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def load_inventory(path: str | Path) -> Any:
    try:
        from sparkdeploy import inventory as inv_mod
    except ImportError as err:
        raise BenchError(f"{path}: --inventory needs sparkdeploy.inventory, which is not available: {err}") from err
    return inv_mod.load(path)


def api_url(inventory: Any) -> str:
    """The head node's API base URL: its data IP (or SSH host) and the API port."""
    nodes = _get(inventory, "nodes") or []
    head = next((n for n in nodes if _get(n, "role") in ("head", "leader") or _get(n, "rank") == 0), None)
    if head is None and nodes:
        head = nodes[0]
    host = _get(head, "data_ip") or _get(head, "ssh_host") or _get(head, "host") or _get(head, "address")
    port = (_get(inventory, "api_port") or _get(inventory, "api", "port") or _get(inventory, "service", "port")
            or _get(inventory, "serve", "port") or _get(inventory, "port"))
    if not host or not port:
        raise BenchError("inventory: cannot tell the head node's API address "
                         f"(host {host!r}, api port {port!r}); pass --url instead")
    return f"http://{host}:{port}"


def from_inventory(inventory: Any, path: str | Path) -> dict:
    """Context recorded from an inventory: desired release settings, plus the live release if readable."""
    ctx: dict[str, Any] = {"source": "inventory", "inventory": str(path)}
    for key, paths in {
        "release": [("release",), ("release", "name")],
        "image": [("image",), ("release", "image"), ("serving", "image")],
        "vocab_hash": [("vocab_hash",), ("vocab", "hash"), ("vocab", "sha256"), ("draft_vocab", "hash")],
        "patches": [("patches",), ("overlays",), ("features",)],
        "model": [("model",), ("profile",)],
    }.items():
        for p in paths:
            v = _get(inventory, *p)
            if v is not None and not (key == "release" and not isinstance(v, (str, int))):
                ctx[key] = _plain(v)
                break
    nodes = _get(inventory, "nodes")
    if nodes:
        ctx["nodes"] = _plain(nodes)
    ctx["release_source"] = "inventory (desired, not read from the nodes)"
    if LIVE_RELEASE_READER is not None:
        try:
            live = LIVE_RELEASE_READER(inventory)
            ctx.update({k: _plain(v) for k, v in live.items() if v is not None})
            ctx["release_source"] = "live (read from the nodes)"
        except SparkdeployError as err:
            ctx["release_source_error"] = str(err)
    return ctx


def from_url(url: str) -> dict:
    return {"source": "url", "url": url}
