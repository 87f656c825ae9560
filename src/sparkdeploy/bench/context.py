"""What a results file records about the thing measured, so two runs can be compared honestly.

Sources, in order of what they can know:
  - the URL alone: only what the API says (model, vLLM version; done by `client.discover`);
  - an inventory: the head node's API address, the image/vocab/patch/profile settings it asks for, the nodes;
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


def load_inventory(path: str | Path, service: str | None = None) -> Any:
    try:
        from sparkdeploy.model import inventory as inv_mod
    except ImportError as err:
        raise BenchError(f"{path}: --inventory needs sparkdeploy.model.inventory, which is not available: {err}") \
            from err
    return inv_mod.load(path, service)


def head_node(inventory: Any) -> Any:
    nodes = _get(inventory, "nodes") or []
    head = next((n for n in nodes if _get(n, "role") == "head"), None)
    return head if head is not None else (nodes[0] if nodes else None)


def api_urls(inventory: Any) -> list[str]:
    """Candidate API base URLs of the head node, best first: its data IP, then its SSH host, at the API port."""
    head = head_node(inventory)
    port = _get(inventory, "ports", "api")
    hosts = [h for h in (_get(head, "data_ip"), _get(head, "ssh", "host")) if h]
    if not hosts or not port:
        raise BenchError(f"{_get(inventory, 'file') or 'inventory'}: cannot tell the head node's API address "
                         f"(hosts {hosts}, ports.api {port!r}); pass --url instead")
    return [f"http://{h}:{port}" for h in dict.fromkeys(hosts)]


def from_inventory(inventory: Any, path: str | Path) -> dict:
    """Context recorded from an inventory: the settings it asks for, plus the live release once readable."""
    ctx: dict[str, Any] = {"source": "inventory", "inventory": str(path), "cluster": _get(inventory, "cluster")}
    image = _get(inventory, "image")
    if image is not None:
        ctx["image"] = {k: _get(image, k) for k in ("base", "vllm_version", "repository")}
    patches = _get(inventory, "patches")
    if patches is not None:
        enabled = getattr(patches, "enabled", None)
        ctx["patches"] = list(enabled()) if callable(enabled) else _plain(patches)
    vocab = _get(inventory, "vocab")
    if vocab is not None:
        ctx["vocab_hash"] = _get(vocab, "sha256")
        ctx["vocab"] = {"path": str(_get(vocab, "path")), "size": _get(vocab, "size")}
    profile = _get(inventory, "profile")
    if profile is not None:
        ctx["profile"] = {k: _plain(_get(profile, k)) for k in
                          ("name", "model_id", "served_name", "tp", "speculative", "max_model_len")}
    nodes = _get(inventory, "nodes") or []
    ctx["nodes"] = [{"name": _get(n, "name"), "role": _get(n, "role"), "data_ip": _get(n, "data_ip"),
                     "ssh_host": _get(n, "ssh", "host"), "gpu": _get(n, "gpu")} for n in nodes]
    ctx["release_source"] = "inventory (desired settings, not read from the nodes)"
    if LIVE_RELEASE_READER is not None:
        try:
            live = LIVE_RELEASE_READER(inventory)
            ctx.update({k: _plain(v) for k, v in live.items() if v is not None})
            ctx["release_source"] = "live (read from the nodes)"
        except SparkdeployError as err:
            ctx["release_source_error"] = str(err)
    return {k: v for k, v in ctx.items() if v is not None}


def from_url(url: str) -> dict:
    return {"source": "url", "url": url}
