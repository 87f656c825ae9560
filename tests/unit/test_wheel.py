"""`pip install .` gives a sparkdeploy that works outside the checkout.

The wheel is built from a copy of the checkout (so the shared tree gets no build/ debris), installed into a
fresh venv that borrows this interpreter's dependencies through plain .pth lines (no network, seconds; the
editable sparkdeploy/spark_overlays finders of this venv stay inactive there), and `plan` and `render` run in a
directory outside the checkout holding only a copy of the shipped inventory and the vocab it names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths

pytestmark = pytest.mark.slow

CHECKOUT = paths.repo_root()
# Never part of a build: caches, VCS, venvs and build outputs of the shared checkout.
NOT_SOURCE = shutil.ignore_patterns(".*", "build", "dist", "bench-results", "__pycache__", "*.pyc", "*.egg-info")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The checkout's files without its .git (so a render from it stamps the same 'unknown' commit)."""
    copy = tmp_path_factory.mktemp("source") / "sparkdeploy"
    shutil.copytree(CHECKOUT, copy, ignore=NOT_SOURCE)
    return copy


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, source) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(source)], check=True)
    (built,) = out.glob("sparkdeploy-*.whl")
    return built


@pytest.fixture(scope="module")
def tool_venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv with the wheel installed; its dependencies come from this venv's site-packages."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # This interpreter's import path, as plain lines, minus entries holding the checkout's own packages.
    deps = [p for p in sys.path if p and Path(p).is_dir()
            and not any((Path(p) / pkg).exists() for pkg in ("sparkdeploy", "spark_overlays"))]
    (purelib / "zz_sparkdeploy_test_deps.pth").write_text("\n".join(deps) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--force-reinstall",
                    "--no-deps", "--no-index", str(wheel)], check=True)
    return venv


@pytest.fixture()
def user_dir(tmp_path) -> Path:
    """What a user of the installed tool has: the shipped inventory and the vocab it names, nothing else."""
    shutil.copy(CHECKOUT / "inventory.yaml", tmp_path / "inventory.yaml")
    vocab = yaml.safe_load((CHECKOUT / "inventory.yaml").read_text()).get("vocab")
    if vocab:
        (tmp_path / vocab).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CHECKOUT / vocab, tmp_path / vocab)
    return tmp_path


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKDEPLOY_ROOT", "PYTHONPATH")}
    return subprocess.run([str(venv / "bin" / "sparkdeploy"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_wheel_carries_the_kit_data_and_no_vllm_plugin(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for dirname in ("deploy/profiles", "deploy/templates", "images", "systemd", "vocabs", "overlays/spark_overlays"):
        assert any(n.startswith(f"sparkdeploy/_data/{dirname}/") for n in names), dirname
    assert "spark_overlays/compat.py" in names
    assert not any("/tests/" in n or ".egg-info" in n for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "vllm.general_plugins" not in zipfile.ZipFile(wheel).read(entry_points).decode()


# What the image build and the vocab lookup read, as seen by one interpreter (run in both, compared).
PROBE = """
import hashlib, json, sparkdeploy, spark_overlays.compat
from sparkdeploy import paths
from sparkdeploy.steps.image import overlay_files
from sparkdeploy.vocab.manifest import resolve_list
print(json.dumps({"modules": [sparkdeploy.__file__, spark_overlays.compat.__file__],
                  "overlays": {k: hashlib.sha256(v).hexdigest() for k, v in overlay_files().items()},
                  "default_vocab": resolve_list("default").read_text().count(chr(10)),
                  "state_dir": str(paths.state_dir())}))
"""


def _probe(python: Path | str, cwd: Path) -> dict:
    done = subprocess.run([str(python), "-c", PROBE], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_installed_tool_plans_and_renders_outside_the_checkout(tool_venv, user_dir, source):
    installed, checkout = _probe(tool_venv / "bin" / "python", user_dir), _probe(sys.executable, CHECKOUT)
    for module_file in installed["modules"]:
        assert Path(module_file).is_relative_to(tool_venv), module_file  # not this venv's editable checkout
    assert installed["overlays"] == checkout["overlays"]  # the serving image's build context
    assert installed["default_vocab"] == checkout["default_vocab"] > 0
    assert not Path(installed["state_dir"]).is_relative_to(tool_venv)  # sim state is never written into the venv

    planned = _run(tool_venv, user_dir, "plan", "--nodes", "2")
    assert planned.returncode == 0, planned.stderr
    out = user_dir / "rendered"
    rendered = _run(tool_venv, user_dir, "render", "--nodes", "2", "--out", str(out))
    assert rendered.returncode == 0, rendered.stderr
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    nodes = [n["name"] for n in yaml.safe_load((user_dir / "inventory.yaml").read_text())["nodes"]]
    assert {"image/Dockerfile", "plan.json"} <= files, sorted(files)
    for node in nodes:
        assert {f"{node}/unit/sparkdeploy-engine.service", f"{node}/release/launch.sh"} <= files, sorted(files)

    # A checkout (the copy without .git: same 'unknown' commit) renders the same inventory to the same bytes.
    reference = user_dir / "rendered-by-checkout"
    subprocess.run([sys.executable, "-m", "sparkdeploy", "render", "--nodes", "2", "--out", str(reference),
                    "--inventory", str(user_dir / "inventory.yaml")], env={**os.environ, "SPARKDEPLOY_ROOT": str(source)},
                   capture_output=True, check=True)
    for rel in sorted(files):
        assert (out / rel).read_bytes() == (reference / rel).read_bytes(), rel
