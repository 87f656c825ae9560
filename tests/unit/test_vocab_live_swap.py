"""The kit's side of a live list swap: move every node's pointer, read each engine rank's report back.

Two nodes reached through the real LocalConn share one local state directory (so pointers move as on a node);
each node's engine is a stand-in that does what the plugin does at a drafter call: look at the pointer, and
log the plugin's report line (the format `test_engine_shortlist` proves the real engine writes).
"""

from __future__ import annotations

import hashlib
import os

import pytest

from sparkdeploy.errors import RemoteError
from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.ops import vocab_live
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn

LINE = ("(Worker pid=15658) WARNING 12-05 17:24:12 [_util.py:26] spark_overlays: shortlist {event} sha256={sha} "
        "rows=2099 capacity=4032 tp_rank={rank}{why} pid=15658 title='VLLM::Worker'\n")


class Engine:
    """One node's engine ranks: they serve a list and, while drafting, take the one the pointer names."""

    def __init__(self, conn, lay, sha, ranks=(0,), refuse=""):
        self.conn, self.lay, self.ranks, self.refuse = conn, lay, ranks, refuse
        self.sha, self.rejected, self.drafting = sha, None, True
        self.log = "".join(LINE.format(event="serves", sha=sha, rank=r, why="") for r in ranks)

    def logs(self, conn, lay) -> str:
        pointed = os.readlink(f"{lay.vocab_host_dir}/current.txt")[:64]
        if self.drafting and pointed not in (self.sha, self.rejected):
            if self.refuse:
                self.rejected = pointed
                self.log += "".join(LINE.format(event="keeps", sha=self.sha, rank=r, why=f" reason={self.refuse}")
                                    for r in self.ranks)
            else:
                self.sha = pointed
                self.log += "".join(LINE.format(event="swapped; serves", sha=pointed, rank=r, why="")
                                    for r in self.ranks)
        return self.log


@pytest.fixture
def nodes(tmp_path):
    """Two nodes with two lists stored and `current.txt` on the first; one engine rank each."""
    lists = {}
    for ids in ("0\n1\n2\n", "0\n5\n"):
        lists[hashlib.sha256(ids.encode()).hexdigest()] = ids.encode()
    old, new = lists
    lay = ServiceLayout(etc_root=str(tmp_path / "etc"), state_root=str(tmp_path))
    out = []
    for rank, name in enumerate(("node1", "node2")):
        conn = LocalConn(Target(name, "127.0.0.1", local=True))
        for sha, data in lists.items():
            vocab_live.store(conn, lay, data, sha, {"source": "x.txt"})
        vocab_live.point(conn, lay, old)
        out.append((conn, lay, Engine(conn, lay, old, ranks=(rank,))))
    return out, old, new


def _swap(nodes, sha, **kw):
    engines = {conn.name: engine for conn, _, engine in nodes}
    kw.setdefault("timeout", 5)
    return vocab_live.live_swap([c for c, _, _ in nodes], nodes[0][1], sha, poll=0.01,
                                logs=lambda conn, lay: engines[conn.name].logs(conn, lay), **kw)


def test_every_rank_reports_the_new_list_and_history_records_it(nodes):
    nodes, old, new = nodes
    result = _swap(nodes, new)
    assert result.ok and {n: {r: s.sha256 for r, s in a.items()} for n, a in result.answers.items()} == {
        "node1": {0: new}, "node2": {1: new}}
    for conn, lay, engine in nodes:
        assert vocab_live.read_state(conn, lay).content == new
        assert vocab_live.served(conn, lay, logs=lambda c, l, e=engine: e.log)[engine.ranks[0]].sha256 == new
        entry = vocab_live.history(conn, lay)[-1]
        assert (entry["action"], entry["result"], entry["from"]) == ("live-swap", "live", old)


def test_a_refusal_puts_every_pointer_back_and_names_the_rank_and_why(nodes):
    nodes, old, new = nodes
    nodes[1][2].refuse = "list of 5000 ids exceeds the head's capacity 4032"
    result = _swap(nodes, new)
    assert not result.ok
    assert result.problems() == [f"node2 rank 1: keeps {old[:12]}: list of 5000 ids exceeds the head's capacity 4032"]
    for conn, lay, _ in nodes:
        assert vocab_live.read_state(conn, lay).content == old  # pointer and engine agree again
        assert vocab_live.history(conn, lay)[-1]["result"] == "refused"


def test_an_idle_engine_is_nudged_and_a_silent_one_times_out_back_to_the_old_list(nodes):
    nodes, old, new = nodes
    engine = nodes[0][2]
    engine.drafting = False
    nudges = []

    def nudge():  # a request makes the engine draft, and so look at the pointer
        nudges.append(1)
        engine.drafting = True

    assert _swap(nodes, new, nudge=nudge).ok and nudges
    engine.drafting = False
    result = _swap(nodes, old, timeout=0.05)
    assert not result.ok and "node1 rank 0: no report" in result.problems()[0]
    assert vocab_live.read_state(nodes[0][0], nodes[0][1]).content == new


def test_an_engine_without_reports_is_refused_before_any_pointer_moves(nodes):
    nodes, old, new = nodes
    nodes[1][2].log = ""
    with pytest.raises(RemoteError, match="node2: the engine reports no draft list"):
        _swap(nodes, new)
    assert all(vocab_live.read_state(c, l).content == old for c, l, _ in nodes)
