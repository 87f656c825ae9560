"""A profile's `engine_args`: any `vllm serve` flag, checked against the pinned vLLM's own parser. Pure.

The kit runs on machines without vLLM, so each supported vLLM series ships the flag catalogue of its own
argument parser (`deploy/vllm-flags/<series>.json`, written by `scripts/vllm_flags.py` from `make_arg_parser`;
an engine test fails when it drifts). A flag that vLLM does not know, or that the kit itself decides (ranks,
ports, memory fraction, speculative config, ...), is refused with the inventory/profile field to use instead.

Values: a string or number is the flag's value; `true` turns a switch on (`false` renders its negative
spelling, or nothing when vLLM has none); a list gives a many-valued flag its values; a mapping is JSON.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from typing import Any, Mapping

from sparkdeploy import paths
from sparkdeploy.errors import InventoryError

# argparse dest -> the field that owns it (the kit renders these flags itself)
OWNED = {
    "model": "model.path", "served_model_name": "model.served_name",
    "host": "the kit (rank 0 serves on all interfaces; secure it with auth.api_key_file)", "port": "ports.api",
    "tensor_parallel_size": "parallel.tp", "pipeline_parallel_size": "parallel.pp",
    "data_parallel_size": "parallel.dp", "data_parallel_rank": "parallel.dp",
    "data_parallel_size_local": "parallel.dp", "data_parallel_address": "parallel.dp",
    "data_parallel_rpc_port": "parallel.dp", "enable_expert_parallel": "parallel.expert_parallel",
    "nnodes": "the inventory's nodes", "node_rank": "the inventory's nodes", "headless": "the inventory's nodes",
    "master_addr": "the head's data_ip", "master_port": "ports.master",
    "distributed_executor_backend": "backend (the inventory: mp or ray)",
    "gpu_memory_utilization": "memory.gpu_memory_utilization (or memory.reserve_gib)",
    "kv_cache_memory_bytes": "memory.gpu_memory_utilization (or memory.reserve_gib)",
    "speculative_config": "speculative (profile) / speculative_tokens (inventory)",
    "additional_config": "patches", "quantization": "checkpoint.format and patches.fp8_gdn",
    "quantization_config": "checkpoint.format and patches.fp8_gdn",
    "api_key": "auth.api_key_file (a key in argv is visible to every process)",
    "hf_token": "auth.hf_token_file (a token in argv is visible to every process)",
    "max_model_len": "engine.max_model_len", "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens", "kv_cache_dtype": "engine.kv_cache_dtype",
    "enforce_eager": "engine.enforce_eager", "enable_prefix_caching": "engine.prefix_caching",
    "scheduler_cls": "the kit (spark_overlays.capture.scheduler: vLLM's own scheduler, counting emitted ids while "
                     "`sparkdeploy vocab capture on`)",
}
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,80}")


@functools.lru_cache(maxsize=None)
def catalogue(series: str) -> dict[str, dict[str, Any]]:
    """{"--flag": {dest, takes_value, many, choices}} of vLLM `series` ("0.33"); InventoryError if none ships."""
    path = paths.repo_root() / "deploy" / "vllm-flags" / f"{series}.json"
    try:
        return json.loads(path.read_text())["flags"]
    except FileNotFoundError:
        raise InventoryError(f"no vllm serve flag catalogue for vLLM {series} ({path}): make one with "
                             f"scripts/vllm_flags.py run by that vLLM", field="image.vllm_version") from None


def switch(series: str, flag: str, on: bool) -> list[str]:
    """A boolean flag's spelling for on/off in this vLLM (`--no-X` became `--disable-X` in 0.33)."""
    if on:
        return [flag]
    flags = catalogue(series)
    stem = flag.removeprefix("--enable-").removeprefix("--")
    for negative in (f"--no-{flag[2:]}", f"--disable-{stem}"):
        if negative in flags and flags[negative]["dest"] == flags[flag]["dest"]:
            return [negative]
    return []


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)


def to_argv(raw: Any, series: str, *, file: str, field: str = "engine_args") -> tuple[str, ...]:
    """Check `engine_args` against vLLM `series`'s parser and turn it into argv (mapping order kept)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InventoryError("expected a mapping of vllm serve flags to values", file=file, field=field)
    flags = catalogue(series)
    argv: list[str] = []
    seen: dict[str, str] = {}
    for key, value in raw.items():
        where = f"{field}.{key}" if isinstance(key, str) and len(key) <= 80 else field
        if not isinstance(key, str) or not _NAME_RE.fullmatch(key.removeprefix("--")):
            raise InventoryError("flag names are letters, digits, '-' and '_' (e.g. tool-call-parser)",
                                 file=file, field=field)
        flag = "--" + key.removeprefix("--").replace("_", "-")
        spec = flags.get(flag)
        if spec is None:
            close = difflib.get_close_matches(flag, list(flags), n=1, cutoff=0.7)
            hint = f" (did you mean {close[0][2:]!r}?)" if close else ""
            raise InventoryError(f"vLLM {series} has no flag {flag}{hint}; see `vllm serve --help`",
                                 file=file, field=where)
        owner = OWNED.get(spec["dest"])
        if owner:
            raise InventoryError(f"{flag} is set by sparkdeploy; use {owner}", file=file, field=where)
        if spec["dest"] in seen:
            raise InventoryError(f"{flag} sets the same option as {seen[spec['dest']]}", file=file, field=where)
        seen[spec["dest"]] = flag
        argv += _flag_argv(flag, spec, value, series, file=file, field=where)
    return tuple(argv)


def _flag_argv(flag: str, spec: Mapping[str, Any], value: Any, series: str, *, file: str, field: str) -> list[str]:
    if not spec["takes_value"]:
        if not isinstance(value, bool):
            raise InventoryError(f"{flag} is a switch: use true or false", file=file, field=field)
        return [flag] if value else []
    if isinstance(value, bool) or value is None:
        raise InventoryError(f"{flag} takes a value (a string, number, list or mapping)", file=file, field=field)
    if isinstance(value, list) and spec["many"]:
        values = [_text(v) for v in value]
        if not values:
            raise InventoryError(f"{flag}: an empty list", file=file, field=field)
    elif isinstance(value, (str, int, float, dict, list)):
        values = [_text(value)]
    else:
        raise InventoryError(f"{flag}: unsupported value type {type(value).__name__}", file=file, field=field)
    for text in values:
        if not text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text) or len(text) > 8192:
            raise InventoryError(f"{flag}: values must be 1..8192 printable characters", file=file, field=field)
        if spec["choices"] and text not in spec["choices"]:
            raise InventoryError(f"{flag}: {text[:60]!r} is not one of {', '.join(spec['choices'])}",
                                 file=file, field=field)
    return [flag, *values]
