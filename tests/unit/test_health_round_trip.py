"""`health` reads each node in ONE round trip (issue 38: it made 5 on the head, 3 on a worker): its releases,
the gate's recorded probe, unit states, container, memory, boot persistence, the live list, stale units and
the sentinel's record come back as sections of one probe. Two loopback nodes (LocalConn, the kit's paths under
tmp_path, stand-ins for `systemctl` and `docker` on PATH), every command counted per node."""

from __future__ import annotations

from collections import Counter

from sparkdeploy.model import inventory as I
from sparkdeploy.ops import health, releases
from sparkdeploy.ops.vocab_live import version_of
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.deploy import Context, Options
from tests.unit.test_dry_run import _two_releases, nodes  # noqa: F401 - the loopback nodes fixture
from tests.unit.test_rollout import _rendered_node_plan

STAND_INS = {
    # every unit asked about is enabled and active; one block per unit, as systemctl prints them
    "systemctl": 'for u in "$@"; do case "$u" in -*|show|ActiveState|UnitFileState|Id) ;; '
                 '*) printf "Id=%s\\nUnitFileState=enabled\\nActiveState=active\\n\\n" "$u";; esac; done',
    "docker": 'case "$1" in info) echo 28.3.3;; inspect) echo "running sha256:aa 2026-12-05T18:00:00Z 0";; '
              "*) exit 1;; esac",
}


def test_health_reads_each_node_in_one_round_trip(nodes, monkeypatch):  # noqa: F811
    for tool, body in STAND_INS.items():
        (nodes / "bin" / tool).write_text(f"#!/bin/sh\n{body}\n")
        (nodes / "bin" / tool).chmod(0o755)
    cx = Context(I.load(str(nodes / "inventory.yaml")), Options(nodes=1))
    _two_releases(cx, nodes / "node")
    head = LocalConn(cx.pool.targets[0])
    releases.mark_healthy(head, cx.lay, 2, {"probe": " Paris."})
    releases.write_sentinel(head, cx.lay, 2, {"verdict": {"text": "as fast as release 1", "regression": False}})
    (nodes / "render").mkdir()
    listed = "ab" * 32  # release 2 is configured with this draft list, which the node lacks
    (nodes / "node/etc/releases/0002/node-plan.json").write_bytes(_rendered_node_plan(listed, nodes / "render"))

    trips: Counter[str] = Counter()
    for method in ("_run", "popen"):
        real = getattr(LocalConn, method)
        monkeypatch.setattr(LocalConn, method, lambda self, *a, _real=real, **kw: (trips.update([self.name]),
                                                                                    _real(self, *a, **kw))[1])
    seen: list[health.ServiceExpect] = []
    monkeypatch.setattr(health, "check_api", lambda rep, exp, **kw: seen.append(exp))  # no engine: the API side

    rep = D.health(cx)
    assert trips == {"node1": 1}  # node2 is outside this one-node deployment: not read at all
    v = {c.name: (c.ok, c.reason) for c in rep.checks if c.node == "node1"}
    assert v["unit"] == (True, "sparkdeploy-engine.service is enabled and active")
    assert v["docker"] == (True, "dockerd 28.3.3")
    assert v["container"] == (True, "sparkdeploy-engine running with image sha256:aa")
    assert v["boot persistence"] == (True, "unit enabled, docker.service enabled, current -> releases/0002")
    assert v["stale units"] == (True, "none")
    assert v["draft vocab"] == (False, f"current.txt is missing or dangling (release 2 expects {version_of(listed)})")
    assert seen[0].probe_expected == " Paris." and seen[0].nodes[0].release == 2
    assert [(c.name, c.reason) for c in rep.checks if c.name == "speed"] == [("speed", "release 2: as fast as release 1")]
