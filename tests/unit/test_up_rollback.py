"""`up`'s automatic rollback when a node does not answer (most often: the reboot that failed the gate). node1 is
this machine through LocalConn, node2 a loopback port where nothing listens, reached by real SSH: its releases
cannot be read, and the rollback waits for it and says so rather than crash."""

from __future__ import annotations

from sparkdeploy.model import inventory as I
from sparkdeploy.remote import ssh
from sparkdeploy.steps import up
from sparkdeploy.steps.deploy import Context, Options
from sparkdeploy.steps.up import UpResult
from tests.unit.test_dry_run import nodes  # noqa: F401 - a fixture: two loopback nodes, PATH stand-ins


def test_a_node_that_cannot_be_read_is_waited_for_and_named(nodes, monkeypatch):  # noqa: F811
    inv = nodes / "inventory.yaml"
    inv.write_text(inv.read_text().replace("host: 127.0.0.3, user: root, port: 22",
                                           "host: 127.0.0.3, user: root, port: 9"))  # nothing listens there
    monkeypatch.setattr(up, "REBOOT_WAIT_S", 1)  # both waits for a rebooting node, 180 s each, cut to 1 s
    reach = ssh.Pool.get
    monkeypatch.setattr(ssh.Pool, "get", lambda pool, name, wait=1: reach(pool, name, wait=wait))
    cx = Context(I.load(str(inv)), Options())
    res = UpResult()
    try:
        up.auto_rollback(cx, 3, "gate: node2 lost", res, watchdog_was=True)
    finally:
        cx.close()
    assert res.message.startswith("release 3 failed (gate: node2 lost); the releases on the nodes could not be read "
                                  "to roll back: node2: reading releases:"), res.message
    assert res.message.endswith("; node2 did not answer within 1 s: re-run up once it does"), res.message
