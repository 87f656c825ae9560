"""`replicas: N` in a service: N copies on disjoint groups of its nodes, `NAME/1`..`NAME/N` to `--service`, the
same names on their nodes, every copy a worker of the router under the one model name; and the rotation a
replica leaves while it restarts, against vLLM's real router core (ops/rotation.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import requests

from sparkdeploy.cli import main
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import inventory
from sparkdeploy.ops import rotation
from sparkdeploy.plan.router import plan_router
from tests.unit.test_router import KEY, _Engine, router_code, start_launcher  # noqa: F401 - a fixture
from tests.unit.test_services import _sim_services, _write


def _replicated(tmp_path, replicas=2, nodes=("node1", "node2", "node3", "node4")):
    data = _sim_services()
    service = dict(data["services"][0], replicas=replicas, nodes=list(nodes))
    data.update(services=[service], auth={"api_key_file": "api_key"}, router={"node": "node1", "port": 8080})
    return _write(tmp_path, data)


def test_a_service_with_two_replicas_is_two_views_on_disjoint_node_groups(tmp_path):
    path = _replicated(tmp_path)
    one, two = inventory.load_services(path)
    assert (one.key, two.key) == ("a/1", "a/2") and one.service == two.service == "a"
    assert [(n.name, n.role) for n in one.nodes] == [("node1", "head"), ("node2", "worker")]
    assert [(n.name, n.role) for n in two.nodes] == [("node3", "head"), ("node4", "worker")]
    assert one.layout == two.layout and one.services == ("a",)  # the same names on their own nodes
    # no replica retires the other's units: the other's nodes are not "outside the service"
    assert one.elsewhere == two.elsewhere == ()
    assert one.tenants == () and one.shared_by("node1") == 1
    rp = plan_router((one, two))
    assert rp.models == (one.profile.served_name,)  # one model, two workers: the router balances them
    assert [(w.key, w.url) for w in rp.workers] == [("a/1", "http://172.30.97.11:8000"),
                                                   ("a/2", "http://172.30.97.13:8000")]
    assert inventory.load(path, "a/2").head.name == "node3"
    with pytest.raises(InventoryError, match=r"service a has 2 replicas \(a/1, a/2\)"):
        inventory.load(path, "a")


@pytest.mark.parametrize("replicas,nodes,field,words", [
    (2, ("node1", "node2", "node3"), "services[0].nodes", "3 nodes do not split into 2 replicas"),
    (0, ("node1", "node2"), "services[0].replicas", "an integer 1..8"),
    ("two", ("node1", "node2"), "services[0].replicas", "an integer 1..8"),
])
def test_replicas_that_do_not_split_the_nodes_exit_2_naming_the_field(tmp_path, capsys, replicas, nodes, field, words):
    path = _replicated(tmp_path, replicas, nodes)
    assert main(["plan", "--inventory", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err and words in err, err


def test_plan_and_render_show_each_replica_under_its_key(tmp_path, capsys):
    path = _replicated(tmp_path)
    assert main(["plan", "--inventory", str(path), "--service", "a", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["services"]
    assert {k: [n["name"] for n in p["nodes"]] for k, p in plans.items()} == {"a/1": ["node1", "node2"],
                                                                            "a/2": ["node3", "node4"]}
    assert main(["plan", "--inventory", str(path), "--service", "a/2", "--json"]) == 0
    assert [n["name"] for n in json.loads(capsys.readouterr().out)["nodes"]] == ["node3", "node4"]
    assert main(["render", "--inventory", str(path), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert (tmp_path / "out" / "a" / "2" / "node3" / "unit" / "sparkdeploy-engine-a.service").is_file()
    targets = json.loads((tmp_path / "out" / "prometheus-targets.json").read_text())
    assert [t["labels"] for t in targets] == [{"service": "a", "node": "node1"}, {"service": "a", "node": "node3"}]


def test_rollback_number_on_a_replicated_service_asks_for_one_replica(tmp_path, capsys):
    path = _replicated(tmp_path)  # its nodes do not exist: a connection attempt would exit 1, not 2
    assert main(["rollback", "3", "--inventory", str(path), "--service", "a"]) == 2
    assert "give NUMBER with --service NAME/R" in capsys.readouterr().err


class _Busy(_Engine):
    """A stand-in engine whose /metrics reports `running` requests (the rotation waits for 0)."""

    def __init__(self, model: str):
        super().__init__(model)
        self.running = 0
        handler, engine = self.server.RequestHandlerClass, self
        plain_get = handler.do_GET

        def do_GET(h):
            if h.path != "/metrics":
                return plain_get(h)
            body = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {engine.running}\n".encode()
            h.send_response(200)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        handler.do_GET = do_GET


@pytest.mark.slow
def test_a_replica_leaves_the_rotation_waits_for_its_requests_and_rejoins(router_code, tmp_path):  # noqa: F811
    """The real router core with two stand-in engines serving one model (what is checked is where the router
    sends requests, and when `leave` returns): out of the rotation, every request goes to the other replica;
    `leave` returns only once the replica reports no request running; back in, both answer again."""
    one, two = _Busy("m"), _Busy("m")
    proc, url = start_launcher(router_code, tmp_path, {one.url: "m", two.url: "m"}, {"m": "a"})
    auth = {"Authorization": f"Bearer {KEY}"}
    said: list[str] = []
    rot = rotation.Rotation(url, KEY, rotation.Worker("a", "m", one.url, "a/1"), said.append)

    def served_by(n: int) -> tuple[int, int]:
        one.seen.clear()
        two.seen.clear()
        for _ in range(n):
            r = requests.post(f"{url}/v1/completions", headers=auth, timeout=10, json={"model": "m", "prompt": "x"})
            assert r.status_code == 200, r.text
        return len(one.seen), len(two.seen)

    try:
        for _ in range(100):
            try:
                if requests.get(f"{url}/v1/models", headers=auth, timeout=2).json().get("data"):
                    break
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.2)
        assert served_by(6) == (3, 3)
        one.running = 1  # a request in flight on the replica: leave() waits for it
        left = threading.Thread(target=rot.leave, args=(one.url,), kwargs={"idle_timeout": 30})
        left.start()
        time.sleep(2)
        assert left.is_alive() and rot.out
        assert served_by(6) == (0, 6)  # out of the rotation already
        one.running = 0
        left.join(10)
        assert not left.is_alive()
        assert rot.workers() == {two.url: "m"}
        rot.rejoin()
        assert not rot.out and set(rot.workers()) == {one.url, two.url}
        time.sleep(1.5)
        assert served_by(6) == (3, 3)
        rot.rejoin()  # nothing to do: it is in
        assert said[-1] == "a/1 back in the router's rotation"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the router core it forked
        proc.communicate(timeout=20)
        one.stop()
        two.stop()
    # a router that does not answer (the first `up`, before the router step): the replica restarts without it
    gone = rotation.Rotation(url, KEY, rot.worker, said.append)
    gone.leave(one.url)
    assert not gone.out and "did not take a/1 out of its rotation" in said[-1]
