"""Shortlist on vs off at TP=2 across the two sim nodes: the draft head changes, greedy outputs do not.

The tiny Qwen3-Next + MTP model (random weights) served from the rendered serving image, tensor parallel over
the sim pair, deployed twice with `up`:
  on   the shortlisted draft head (an odd-sized list, so the vocab-parallel split is uneven), drafting by the
       overlay's local argmax under TP (`use_local_argmax_reduction`, rendered by the planner)
  off  `patches.shortlist: false`: the stock MTP head and full-logits drafting
Each rank must log its own half of the list, drafts must really have been proposed in both runs, and the
temperature-0 outputs of the fixed prompt set must be byte-identical.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sparkdeploy import inventory as I
from sparkdeploy import rollout
from sparkdeploy.plan import CONTAINER_NAME
from sparkdeploy.steps.deploy import Cluster, Options

MTP_PROFILE = "sim-tiny-next-mtp"
LIST_SIZE = 1501  # odd: rank 0 gets one row more than rank 1 (the loader pads the rest)
BUILT = re.compile(r"shortlist head built: (\d+) rows of (\d+) .*rank rows (\d+)\.\.(\d+)")


def _deploy(sim, d: Path, name: str, shortlist: bool) -> dict:
    """`up` with the MTP profile and the shortlist on or off; the outputs, drafts and rank logs."""
    data = yaml.safe_load(Path(sim.inventory).read_text())
    data["profile"] = MTP_PROFILE
    data["patches"]["shortlist"] = shortlist
    vocab = d / "list.txt"
    vocab.write_text("".join(f"{i}\n" for i in range(LIST_SIZE)))
    data["vocab"] = str(vocab)
    path = d / f"inventory-{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = I.load(path)
    with Cluster(inv, Options(ready_timeout=900, log=print)) as cluster:
        res = cluster.up()
    assert res.healthy, res.message
    url = f"http://{inv.head.ssh.host}:{inv.ports.api}"
    golden = rollout.capture(url, inv.profile.served_name, rollout.golden_prompts(per_category=2),
                             max_tokens=24, timeout=120, api_key=inv.auth.api_key())
    logs = {n.name: sim.ssh(n, f"docker logs {CONTAINER_NAME} 2>&1", timeout=60).out for n in sim.nodes}
    spec = [a for a in golden.acceptance.values() if a]
    return {"outputs": golden.outputs, "drafts": sum(a["drafts"] for a in spec), "logs": logs}


@pytest.fixture(scope="module")
def runs(sim_cluster, sim_engine_image, tmp_path_factory):
    d = tmp_path_factory.mktemp("shortlist-tp2")
    return {"on": _deploy(sim_cluster, d, "on", True), "off": _deploy(sim_cluster, d, "off", False)}


def test_each_rank_builds_its_share_of_the_shortlisted_head(runs):
    shares = []
    for node, log in runs["on"]["logs"].items():
        found = {m.groups() for m in BUILT.finditer(log)}
        assert len(found) == 1, f"{node}: expected one 'shortlist head built' line per rank, got {found}"
        rows, vocab, start, end = map(int, found.pop())
        assert (rows, vocab) == (LIST_SIZE, 4096), node
        shares.append((start, end))
        assert "shortlist head loaded" in log and "shortlist head in use" in log, node
    shares.sort()
    assert shares[0][0] == 0 and shares[0][1] == shares[1][0] and shares[1][1] == LIST_SIZE, shares
    assert "Using local argmax reduction" in "".join(runs["on"]["logs"].values())


def test_shortlist_off_runs_the_stock_head(runs):
    for node, log in runs["off"]["logs"].items():
        assert "shortlist head built" not in log, node


def test_greedy_outputs_identical_with_shortlist_on_and_off(runs):
    """Guards the target path (the overlay must not touch the verifier's head or weights), not the draft head:
    a wrong draft would pass this too. The draft head's quality is measured by acceptance in
    overlays/tests/test_engine_shortlist.py (constructed weights: a list lacking the needed ids drops to 0)."""
    assert runs["on"]["drafts"] > 0 and runs["off"]["drafts"] > 0  # speculation really ran both times
    on, off = runs["on"]["outputs"], runs["off"]["outputs"]
    assert len(on) >= 6 and all(on.values())
    assert on == off, {k: (on[k], off.get(k)) for k in on if on[k] != off.get(k)}
