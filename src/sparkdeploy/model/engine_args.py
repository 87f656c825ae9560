"""A profile's `engine_args`: any `vllm serve` flag, checked against the pinned vLLM's own parser. Pure.

The kit runs on machines without vLLM, so each supported vLLM series ships the flag catalogue of its own
argument parser (`deploy/vllm-flags/<series>.json`, written by `scripts/vllm_flags.py` from `make_arg_parser`;
an engine test fails when it drifts). A flag that vLLM does not know, or that the kit itself decides (ranks,
ports, memory fraction, speculative config, where the API listens, ...), is refused with the inventory/profile
field to use instead.

Values are judged offline as the pin's parser would, so a typo exits 2 at `plan` rather than on the node after the
old release stopped: the catalogue's type (int, float, size, json, text), choices, the tool-call and reasoning
parser names vLLM registers, and a config class's keys. A string or number is the flag's value; `true` turns a
switch on and `false` renders the pin's opposite spelling (refused when it has none: dropping it would leave
vLLM's default on); a list gives a many-valued flag its values; a mapping is JSON (no NaN or infinity).
"""

from __future__ import annotations

import difflib
import functools
import json
import math
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
    "spec_method": "speculative.method (profile)", "spec_tokens": "speculative.num_speculative_tokens (profile)",
    "spec_model": "speculative.model (profile)",
    "additional_config": "patches", "quantization": "checkpoint.format and patches.fp8_gdn",
    "quantization_config": "checkpoint.format and patches.fp8_gdn",
    "api_key": "auth.api_key_file (a key in argv is visible to every process)",
    "hf_token": "auth.hf_token_file (a token in argv is visible to every process)",
    "max_model_len": "engine.max_model_len", "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens", "kv_cache_dtype": "engine.kv_cache_dtype",
    "enforce_eager": "engine.enforce_eager", "enable_prefix_caching": "engine.prefix_caching",
    "config": "the profile (a vLLM config file could set flags the kit owns; put each flag in engine_args)",
    "uds": "ports.api (the gate, watchdog and bench reach the API over TCP)",
    "ssl_keyfile": "ports.api (the gate, watchdog and bench speak http://; terminate TLS in front of the API)",
    "ssl_certfile": "ports.api (the gate, watchdog and bench speak http://; terminate TLS in front of the API)",
    "data_parallel_start_rank": "parallel.dp", "data_parallel_hybrid_lb": "parallel.dp",
    "scheduler_cls": "the kit (spark_overlays.capture.scheduler: vLLM's own scheduler, counting emitted ids while "
                     "`sparkdeploy vocab capture on`)",
}
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,80}")
# a registered-name flag -> the flag that loads more names at start (then only the node can judge the name)
_PLUGIN_OF = {"tool_call_parser": "tool_parser_plugin", "reasoning_parser": "reasoning_parser_plugin"}
_SIZE_RE = re.compile(r"\d+(\.\d+)?[kKmMgGtT]|\d+")  # vLLM's human_readable_int


@functools.lru_cache(maxsize=None)
def catalogue(series: str) -> dict[str, dict[str, Any]]:
    """{"--flag": {dest, takes_value, many, choices, type, keys, registered}} of vLLM `series` ("0.33")
    (scripts/vllm_flags.py says what each means; a catalogue without the last three is judged by name only);
    InventoryError if none ships."""
    path = paths.repo_root() / "deploy" / "vllm-flags" / f"{series}.json"
    try:
        return json.loads(path.read_text())["flags"]
    except FileNotFoundError:
        raise InventoryError(f"no vllm serve flag catalogue for vLLM {series} ({path}): make one with "
                             f"scripts/vllm_flags.py run by that vLLM", field="image.vllm_version") from None


def switch(series: str, flag: str, on: bool) -> list[str]:
    """A boolean flag's spelling for on/off in this vLLM (`--no-X` became `--disable-X` in 0.33); [] if it has none."""
    if on:
        return [flag]
    flags = catalogue(series)
    name = flag[2:]
    stem = name.removeprefix("enable-")
    positive = name.removeprefix("no-").removeprefix("disable-")
    for opposite in (f"--no-{name}", f"--disable-{stem}", f"--enable-{positive}", f"--{positive}"):
        if opposite != flag and opposite in flags and flags[opposite]["dest"] == flags[flag]["dest"]:
            return [opposite]
    return []


def _json(value: Any, flag: str, *, file: str, field: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InventoryError(f"{flag}: NaN and infinity are not JSON values", file=file, field=field) from None


def to_argv(raw: Any, series: str, *, file: str, field: str = "engine_args") -> tuple[str, ...]:
    """Check `engine_args` against vLLM `series`'s parser and turn it into argv (mapping order kept)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InventoryError("expected a mapping of vllm serve flags to values", file=file, field=field)
    flags = catalogue(series)
    argv: list[str] = []
    seen: dict[str, tuple[str, str]] = {}  # dest -> (key, flag) that set it
    dests_given = {flags[f]["dest"] for f in ("--" + str(k).removeprefix("--").replace("_", "-") for k in raw)
               if f in flags}
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
            first_key, first_flag = seen[spec["dest"]]
            same = f"{flag} is given twice ({first_key!r} and {key!r})" if first_flag == flag else \
                f"{flag} sets the same option as {first_flag}"
            raise InventoryError(same, file=file, field=where)
        seen[spec["dest"]] = (key, flag)
        argv += _flag_argv(flag, spec, value, series, file=file, field=where,
                           plugin_loaded=_PLUGIN_OF.get(spec["dest"]) in dests_given)
    return tuple(argv)


def _flag_argv(flag: str, spec: Mapping[str, Any], value: Any, series: str, *, file: str, field: str,
               plugin_loaded: bool = False) -> list[str]:
    if not spec["takes_value"]:
        if not isinstance(value, bool):
            raise InventoryError(f"{flag} is a switch: use true or false", file=file, field=field)
        spelled = switch(series, flag, value)
        if not spelled:
            raise InventoryError(f"vLLM {series} has no spelling that turns {flag} off; remove the key to keep "
                                 f"vLLM's default", file=file, field=field)
        return spelled
    if isinstance(value, bool) or value is None:
        raise InventoryError(f"{flag} takes a value (a string, number, list or mapping)", file=file, field=field)
    if isinstance(value, list) and spec["many"]:
        if not value:
            raise InventoryError(f"{flag}: an empty list", file=file, field=field)
        values = [_value_text(flag, spec, v, file=file, field=field) for v in value]
    else:
        values = [_value_text(flag, spec, value, file=file, field=field)]
    for text in values:
        if not text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text) or len(text) > 8192:
            raise InventoryError(f"{flag}: values must be 1..8192 printable characters", file=file, field=field)
        if spec["choices"] and text not in spec["choices"]:
            raise InventoryError(f"{flag}: {text[:60]!r} is not one of {', '.join(spec['choices'])}",
                                 file=file, field=field)
        names = spec.get("registered")
        if names and not plugin_loaded and text not in names and text.lower() != "none":
            close = difflib.get_close_matches(text, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; vLLM {series} has {', '.join(names)}"
            raise InventoryError(f"{flag}: vLLM {series} registers no parser {text[:60]!r}{hint}",
                                 file=file, field=field)
    return [flag, *values]


def _value_text(flag: str, spec: Mapping[str, Any], value: Any, *, file: str, field: str) -> str:
    """One value as its argv word, refused where the pin's converter for `spec["type"]` would refuse it."""
    kind = spec.get("type", "json_or_text")  # a catalogue older than types: judged by name only, as before
    if isinstance(value, (dict, list)):
        if kind not in ("json", "json_or_text"):
            shape = "a list" if isinstance(value, list) else "a mapping"
            raise InventoryError(f"{flag} takes one {kind} value, not {shape}" +
                                 (" (a list only for flags that take several)" if isinstance(value, list) else ""),
                                 file=file, field=field)
        return _config_json(flag, spec, value, file=file, field=field)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InventoryError(f"{flag}: unsupported value type {type(value).__name__}", file=file, field=field)
    if isinstance(value, float) and not math.isfinite(value):
        raise InventoryError(f"{flag}: {value} is not a value vLLM takes", file=file, field=field)
    text = str(value)
    if kind == "int" and not (isinstance(value, int) or (isinstance(value, str) and _parses(int, text))):
        raise InventoryError(f"{flag} takes an integer, not {text[:60]!r}", file=file, field=field)
    if kind == "float" and not (isinstance(value, (int, float)) or _finite_float(text)):
        raise InventoryError(f"{flag} takes a number, not {text[:60]!r}", file=file, field=field)
    if kind == "size" and not (isinstance(value, int) or _SIZE_RE.fullmatch(text.strip())):
        raise InventoryError(f"{flag} takes an integer such as 8192 or 8k, not {text[:60]!r}", file=file, field=field)
    if kind == "json" and isinstance(value, str):
        try:
            parsed = json.loads(text)
        except ValueError:
            raise InventoryError(f"{flag} takes JSON (write a YAML mapping), not {text[:60]!r}",
                                 file=file, field=field) from None
        _config_json(flag, spec, parsed, file=file, field=field)
    return text


def _config_json(flag: str, spec: Mapping[str, Any], value: Any, *, file: str, field: str) -> str:
    keys = spec.get("keys")
    if keys and isinstance(value, dict):
        for key in value:
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InventoryError(f"{flag}: the pinned vLLM's config has no key {str(key)[:60]!r}{hint}",
                                     file=file, field=f"{field}.{str(key)[:60]}")
    return _json(value, flag, file=file, field=field)


def _parses(convert: Any, text: str) -> bool:
    try:
        convert(text)
    except ValueError:
        return False
    return True


def _finite_float(text: str) -> bool:
    return _parses(float, text) and math.isfinite(float(text))
