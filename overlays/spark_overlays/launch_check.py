"""Would the vLLM installed here start this `vllm serve` argv? Its own parser and the config classes that need no
GPU and no model judge it, before anything is loaded.

    python -m spark_overlays.launch_check vllm serve MODEL --flag value ...

Prints one JSON line {"vllm_version", "refused": null | {"flag": "--x" | null, "error": "..."}} and exits 0 when
vLLM would go on to load the model, 1 when it refuses. `sparkdeploy up` runs it inside the new serving image on
every node, on each rank's exact argv and env, after the image is there and before the old release stops
(steps/launch_check.py); the engine tests run `refusal` over every shipped profile's argv.

What it runs, in the order `vllm serve` does: the parser `make_arg_parser` builds (unknown flag, bad choice,
bad type, bad JSON), `validate_parsed_serve_args` (switch pairs, chat template) and `validate_api_server_args`
(registered tool-call parser), the reasoning parser against vLLM's registry, `EngineArgs.from_cli_args` (the
config classes built at parse time: compilation, ...), the keys of `--speculative-config` against
SpeculativeConfig's fields (building it needs the target model), `--structured-outputs-config` through
StructuredOutputsConfig, and this plugin's own `--additional-config` section (settings.parse).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import sys
import tempfile

# where the releases keep `make_arg_parser` and the pre-load checks of `vllm serve` (they moved between releases)
PARSER_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                  "vllm.entrypoints.openai.cli_args")
CHECK_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                 "vllm.entrypoints.launchers.launcher", "vllm.entrypoints.openai.cli_args")
_FLAG = re.compile(r"argument (--[a-z0-9-]+)")


def serve_parser():
    """vLLM's own `vllm serve` option parser."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "make_arg_parser"):
            return module.make_arg_parser(FlexibleArgumentParser())
    raise RuntimeError(f"no make_arg_parser in {', '.join(PARSER_MODULES)}")


def pre_load_checks() -> list:
    """`validate_parsed_serve_args` and `validate_api_server_args`, wherever this vLLM keeps them."""
    found = []
    for name in ("validate_parsed_serve_args", "validate_api_server_args"):
        for module_name in CHECK_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, name):
                found.append(getattr(module, name))
                break
    return found


def _refused(error: str, flag: str | None = None, argv: list[str] = ()) -> dict:
    """The refusal, with the flag it is about: named by argparse ("argument --x"), or the one flag of `argv`
    whose words the error uses ("invalid tool call parser" -> --tool-call-parser)."""
    match = _FLAG.search(error)
    if flag is None and match:
        flag = match.group(1)
    if flag is None:
        words = error.lower().replace("_", " ")
        named = [a for a in argv if a.startswith("--") and a[2:].replace("-", " ") in words]
        flag = max(named, key=len) if named else None
    return {"flag": flag, "error": error}


def _argparse_error(text: str) -> str:
    """argparse's own lines (after "error:"), without the usage block and pydantic's pointer to its docs."""
    _, sep, tail = text.rpartition("error: ")
    lines = [ln.strip() for ln in (tail if sep else text).strip().splitlines()
             if ln.strip() and "For further information visit" not in ln]
    return " ".join(lines) or "the argument parser refused the command line"


def refusal(argv: list[str], parser=None, checks=None, *, stand_in_model: bool = False) -> dict | None:
    """vLLM's complaint about `argv` ({"flag", "error"}), or None when `vllm serve` would go on to load.

    `stand_in_model`: judge the flags with an empty local directory for the model (a check away from the
    checkpoint, e.g. the engine tests'); without it a model path that is not there is itself the refusal."""
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
        return _refused(f"not a `vllm serve MODEL` command: {argv[:3]}")
    parser = parser or serve_parser()
    checks = pre_load_checks() if checks is None else checks
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(["--model", argv[2], *argv[3:]])
        for check in checks:
            check(args)
    except SystemExit:  # argparse: unknown flag, bad choice, bad type, bad JSON
        return _refused(_argparse_error(stderr.getvalue()), argv=argv)
    except (TypeError, ValueError, KeyError) as err:
        return _refused(f"{type(err).__name__}: {err}", argv=argv)
    if stand_in_model:
        args.model = tempfile.mkdtemp(prefix="launch-check-model-")
    elif args.model.startswith("/") and not os.path.exists(args.model):
        return _refused(f"the model path {args.model} is not there (is model.host_dir mounted?)", "--model")
    return _config_refusal(args, argv)


def _config_refusal(args, argv: list[str]) -> dict | None:
    from vllm.reasoning import ReasoningParserManager

    reasoning = getattr(args, "reasoning_parser", None)
    if reasoning and reasoning not in ReasoningParserManager.list_registered():
        return _refused(f"invalid reasoning parser: {reasoning} (choose from "
                        f"{', '.join(sorted(ReasoningParserManager.list_registered()))})", "--reasoning-parser")
    from vllm.engine.arg_utils import EngineArgs

    try:
        EngineArgs.from_cli_args(args)
    except (TypeError, ValueError, KeyError) as err:
        return _refused(f"{type(err).__name__}: {err}", argv=argv)
    spec = getattr(args, "speculative_config", None)
    if spec:
        from vllm.config import SpeculativeConfig

        known = {f.name for f in dataclasses.fields(SpeculativeConfig)}
        unknown = sorted(k for k in spec if k.replace("-", "_") not in known)
        if unknown:
            return _refused(f"unknown key(s) {', '.join(unknown)} in --speculative-config (SpeculativeConfig of this "
                            f"vLLM has no such field)", "--speculative-config")
    structured = getattr(args, "structured_outputs_config", None)
    if isinstance(structured, dict):
        from vllm.config import StructuredOutputsConfig

        try:
            StructuredOutputsConfig(**structured)
        except (TypeError, ValueError) as err:
            return _refused(f"{type(err).__name__}: {err}", "--structured-outputs-config")
    additional = getattr(args, "additional_config", None)
    if additional:
        from spark_overlays.settings import SettingsError, parse

        try:
            parse(additional)
        except SettingsError as err:
            return _refused(f"spark_overlays: {err}", "--additional-config")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with contextlib.redirect_stdout(sys.stderr):  # vLLM logs to stdout: keep ours the one JSON line
        import vllm

        refused = refusal(argv)
    print(json.dumps({"vllm_version": vllm.__version__, "refused": refused}))
    return 0 if refused is None else 1


if __name__ == "__main__":
    sys.exit(main())
