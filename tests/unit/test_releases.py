"""Release directories on a node (exercised through a LocalConn on a temp root)."""

from __future__ import annotations

import os

import pytest

from sparkdeploy.errors import RemoteError
from sparkdeploy.node import probes
from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.ops import releases
from sparkdeploy.remote import connection
from sparkdeploy.remote import ssh as remote


@pytest.fixture
def lay(tmp_path):
    return ServiceLayout(etc_root=str(tmp_path))


@pytest.fixture
def conn():
    return remote.LocalConn(connection.Target("n", "localhost", local=True))


def test_empty_node(conn, lay):
    nr = releases.scan(conn, lay)
    assert nr.complete == {} and nr.current is None and nr.newest == 0


def test_write_switch_scan_digests(conn, lay, tmp_path):
    files = {"launch.sh": (b"#!/bin/sh\n", 0o755), "sub/engine.env": (b"A=1\n", 0o600)}
    releases.write(conn, lay, 1, files, {"fingerprint": "abc"})
    releases.switch(conn, lay, 1)
    nr = releases.scan(conn, lay)
    assert nr.current == 1 and nr.complete[1]["fingerprint"] == "abc" and not nr.healthy
    assert os.readlink(tmp_path / "current") == "releases/0001"
    assert oct(os.stat(tmp_path / "current" / "launch.sh").st_mode & 0o777) == "0o755"
    assert releases.file_digests(conn, lay, 1) == {n: releases.sha(b) for n, (b, _) in files.items()}
    releases.mark_healthy(conn, lay, 1, {"probe": "x"})
    assert releases.scan(conn, lay).healthy == {1}
    assert releases.read_healthy(conn, lay, 1) == {"probe": "x"}


def test_incomplete_release_is_never_switched_and_is_pruned(conn, lay, tmp_path):
    releases.write(conn, lay, 1, {"a": (b"1", 0o644)}, {})
    releases.switch(conn, lay, 1)
    (tmp_path / "releases" / "0002").mkdir()
    (tmp_path / "releases" / "0002" / "a").write_text("half")
    nr = releases.scan(conn, lay)
    assert nr.incomplete == [2] and nr.newest == 2
    with pytest.raises(RemoteError, match="incomplete"):
        releases.switch(conn, lay, 2)
    assert releases.prune(conn, lay, nr) == [2]
    assert releases.scan(conn, lay).incomplete == []


def test_prune_keeps_newest_and_current(conn, lay):
    for n in range(1, 9):
        releases.write(conn, lay, n, {"a": (str(n).encode(), 0o644)}, {})
    releases.switch(conn, lay, 2)
    dropped = releases.prune(conn, lay, releases.scan(conn, lay), keep=5)
    assert dropped == [1, 3]
    assert sorted(releases.scan(conn, lay).complete) == [2, 4, 5, 6, 7, 8]


def test_last_healthy_is_common_to_all_nodes():
    a = releases.NodeReleases(complete={1: {}, 2: {}, 3: {}}, healthy={1, 2, 3})
    b = releases.NodeReleases(complete={1: {}, 2: {}, 3: {}}, healthy={1, 2})
    assert releases.last_healthy({"a": a, "b": b}) == 2
    assert releases.last_healthy({"a": a, "b": b}, before=2) == 1
    assert releases.last_healthy({"a": a, "b": releases.NodeReleases()}) is None


def test_scan_cut_short_is_an_error_not_an_incomplete_release(conn, lay):
    releases.write(conn, lay, 1, {"a": (b"1", 0o644)}, {"fingerprint": "abc"})
    releases.switch(conn, lay, 1)
    out = conn.run(probes.named_probe_argv("scan", {"releases": releases.SCAN}, releases.scan_values(lay))).stdout
    whole = probes.section_text(probes.split_sections(out), "releases")
    assert releases.parse_scan(whole, "n").complete[1]["fingerprint"] == "abc"
    # the same output losing its tail (a META line read halfway, no CURR, no END) must not read as
    # "release 1 incomplete, none current": prune would delete the running release
    with pytest.raises(RemoteError, match="cut short"):
        releases.parse_scan(whole[: whole.index("abc")], "n")
