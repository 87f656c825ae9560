"""steps/capture.py against this machine's shell (LocalConn), the kit's paths moved under tmp_path: what a node
says about capture (wired into its current release, switched on, its counts files) and the switch itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.remote import connection
from sparkdeploy.remote import ssh as remote
from sparkdeploy.steps import capture


@pytest.fixture
def node(tmp_path):
    cap, cur = tmp_path / "capture", tmp_path / "current"
    cur.mkdir()
    lay = ServiceLayout(etc_root=str(tmp_path), state_root=str(tmp_path))
    conn = remote.LocalConn(connection.Target("n1", "localhost", local=True))
    cx = SimpleNamespace(names=["n1"], head="n1", conn=lambda n: conn, log=None, lay=lay,
                         each=lambda fn, what, names=None: {"n1": fn(conn)})
    return SimpleNamespace(conn=conn, cx=cx, cap=cap, cur=cur, lay=lay)


def test_a_node_says_whether_capture_is_wired_on_and_what_it_counted(node):
    assert capture.read(node.conn, node.lay) == capture.NodeCapture("n1", wired=False, on=False, files={})
    (node.cur / "node-plan.json").write_text('{"serve_argv": ["--scheduler-cls", "spark_overlays.capture.scheduler"]}')
    node.cap.mkdir()
    (node.cap / "counts.npy").write_bytes(b"x" * 10)
    (node.cap / "counts.dp1.npy").write_bytes(b"y" * 3)
    (node.cap / "notes.txt").write_text("not counts")
    (node.cap / "on").touch()
    assert capture.read(node.conn, node.lay) == capture.NodeCapture(
        "n1", wired=True, on=True, files={str(node.cap / "counts.dp1.npy"): 3, str(node.cap / "counts.npy"): 10})


def test_on_is_refused_where_the_release_is_not_wired_and_changes_nothing(node):
    with pytest.raises(capture.CaptureError, match="n1: the release serving there was deployed without traffic"):
        capture.switch(node.cx, "on")
    assert not node.cap.exists()


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_on_off_clear_flip_files_once_and_a_dry_run_touches_nothing(node):
    (node.cur / "node-plan.json").write_text(capture.CAPTURE_SCHEDULER)
    dry = capture.switch(node.cx, "on", dry_run=True)
    assert [o.status for o in dry] == ["would change"] and not node.cap.exists()
    assert [o.status for o in capture.switch(node.cx, "on")] == ["changed"] and (node.cap / "on").exists()
    assert [o.status for o in capture.switch(node.cx, "on")] == ["ok"]  # already on: nothing to do
    (node.cap / "counts.npy").write_bytes(b"\x93NUMPY")
    assert [o.status for o in capture.switch(node.cx, "off")] == ["changed"] and not (node.cap / "on").exists()
    assert (node.cap / "counts.npy").exists()  # off keeps what was counted
    assert [o.status for o in capture.switch(node.cx, "clear")] == ["changed"]
    assert sorted(p.name for p in node.cap.iterdir()) == []
    with pytest.raises(capture.CaptureError, match="no counts on any node"):
        capture.pull(node.cx)
