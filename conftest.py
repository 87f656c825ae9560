"""Fixtures, markers and groups shared by every test tree (tests/ and overlays/tests/).

Every test under tests/cluster needs the simulated cluster (marker `cluster`) except test_sim_units.py, which
is pure code and runs with the unit tests.

`make test` runs two xdist workers (one per core) with `--dist loadscope`. Cluster tests that share a
simulated cluster run in file order in one scope, and each xdist worker has its own session cluster
(`sim_cluster`, named per worker). The cluster modules are split into six scopes, handed out first and in this
order (CLUSTER_SCOPES, as CI measured them: scripts/ci_summary.py), each to the next worker that runs low:
  "cluster"            deploy, doctor, model fetch, the sim's own tests (~1,450 s)
  "cluster-vocab"      vocab rollout (the MTP profile) on that worker's pair (~900 s)
  "cluster-quad"       the 3-node ring, then the 4-node services module (each a cluster of its own, downed
                       after; ~1,250 s)
  "cluster-shortlist"  the shortlisted MTP head at TP=2 (~300 s)
  "cluster-c"          the failure matrix (~700 s)
  "cluster-layers"     image layers (~280 s), last: it empties its pair's worker node of images, and a module
                       after it on that pair would wait for the image to come back first (60-95 s of a preload, or
                       a full pull)
then every other module, each a scope of its own (a module-scoped vLLM server starts once). Every module deploys
what it needs onto the pair it finds, so any scope runs on either worker's pair. Measured: one worker
running every cluster module took 71 min of CI, two halves 57 min. A third worker made it slower: the run is
CPU-bound (an `up` that restarts the pair costs ~58 CPU-seconds), and three lanes took the first deploy from
356 s to 891 s.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkdeploy import timing

REPO = Path(__file__).resolve().parent
TINY_MODEL_SCRIPT = REPO / "images" / "sim-engine" / "make_tiny_models.py"
CLUSTER_DIR = REPO / "tests" / "cluster"
# cluster modules that do not run on the first worker's pair: their scope (see the docstring)
OWN_CLUSTER = {CLUSTER_DIR / "test_ring.py": "cluster-quad", CLUSTER_DIR / "test_services.py": "cluster-quad",
               CLUSTER_DIR / "test_shortlist_tp2.py": "cluster-shortlist",
               CLUSTER_DIR / "test_vocab_rollout.py": "cluster-vocab", CLUSTER_DIR / "test_failures.py": "cluster-c",
               CLUSTER_DIR / "test_image_layers.py": "cluster-layers"}
# handed out first, in this order
CLUSTER_SCOPES = ("cluster", "cluster-vocab", "cluster-quad", "cluster-shortlist", "cluster-c", "cluster-layers")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Directory holding tiny-qwen3 and tiny-qwen3-next-mtp, made once per session (deterministic, offline).

    `$SPARKDEPLOY_TINY_MODELS` (default /opt/sparkdeploy/tiny-models, made by scripts/setup.sh) skips the build.
    """
    from tests.support.vllm_server import require_venv

    cached = os.environ.get("SPARKDEPLOY_TINY_MODELS", "/opt/sparkdeploy/tiny-models")
    if cached and all((Path(cached) / m / "config.json").is_file() for m in ("tiny-qwen3", "tiny-qwen3-next-mtp")):
        return Path(cached)
    python = require_venv()
    out = tmp_path_factory.mktemp("tiny-models")
    subprocess.run([str(python), str(TINY_MODEL_SCRIPT), "--out", str(out)], check=True, capture_output=True,
                   timeout=900)
    return out


def _needs_cluster(path: Path) -> bool:
    return CLUSTER_DIR in path.parents and path.name != "test_sim_units.py"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _needs_cluster(Path(str(item.fspath))):
            item.add_marker(pytest.mark.cluster)


def pytest_xdist_make_scheduler(config, log):
    """With --dist loadscope: one scope per module, except that the cluster modules are one scope together.

    (xdist's own loadgroup cannot do this under pytest 9.2: it renames items through `_nodeid`, which pytest no
    longer reads.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ClusterModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = REPO / nodeid.split("::", 1)[0]
            if module in OWN_CLUSTER:
                return OWN_CLUSTER[module]
            return "cluster" if _needs_cluster(module) else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            """The cluster scopes go out before anything else, longest first (the rest keeps collection order)."""
            first = next((scope for scope in CLUSTER_SCOPES if scope in self.workqueue), None)
            if first:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return ClusterModulesTogether(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Module and session fixtures that take a second or more are logged as "fixture" spans (sparkdeploy.timing):
    the cluster, image and deploy fixtures are where a CI run's time goes (scripts/ci_summary.py)."""
    t0 = time.monotonic()
    try:
        return (yield)
    finally:
        seconds = time.monotonic() - t0
        if seconds >= 1 and fixturedef.scope in ("module", "session"):
            timing.record("fixture", f"{fixturedef.argname} @ {request.node.nodeid or 'session'}", seconds)


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown of half a second or more, logged once (by xdist's controller, or
    the only process) with the worker that ran it: the per-worker totals show the run's critical path."""
    if os.environ.get("PYTEST_XDIST_WORKER") or report.duration < 0.5:
        return
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
    timing.record(f"test {report.when}", f"{worker} {report.nodeid}", report.duration, ok=not report.failed)
