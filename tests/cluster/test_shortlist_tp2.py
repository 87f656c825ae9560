"""The shortlisted MTP draft head at TP=2 across the two sim nodes, measured by acceptance.

The model is the tiny Qwen3-Next + MTP with constructed weights (overlays/tests/vllm_scripts/counting_model.py):
the target counts (greedy next token = current + 1) and the MTP draft predicts the token after that, so the
draft is right exactly when the shortlisted head can say the counted id. It is a host checkpoint: copied to
each node's disk and bind-mounted read-only at the profile's path, as a real Spark serves its weights. Deployed
twice with `up`, the shortlist on both times, drafting by the overlay's local argmax under TP
(`use_local_argmax_reduction`, rendered by the planner), vocab-parallel over the two ranks:
  listed   an odd-sized list holding the counted ids: acceptance near 1 (a wrong rank split, id mapping or
           all-reduce of the local argmax drops it)
  missing  a list lacking the counted ids: the draft can never be right, acceptance near 0
Both times the target still counts: the verifier's head is not the shortlisted one. The missing list also lacks
the ids the counting model answers `bench probe`'s one chat message with, so the probe's acceptance figure tells
the two lists apart (issue 33: a failed `up` with the listed list, then a reboot, must keep drafting from the
missing one).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from sparkdeploy.bench import metrics
from sparkdeploy.model import inventory as I
from sparkdeploy.model import served_tokenizer
from sparkdeploy.node.layout import PLAIN
from sparkdeploy.ops.health import bearer
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps import vocab_rollout as rollout
from sparkdeploy.steps.deploy import Context, Options
from tests.cluster.test_deploy import cli, health_json, up_json, wait_healthy
from tests.support.vllm_server import require_venv

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
COUNTING_SCRIPT = REPO / "overlays" / "tests" / "vllm_scripts" / "counting_model.py"
MTP_PROFILE = REPO / "deploy" / "profiles" / "sim-tiny-next-mtp.yaml"
HOST_DIR = "/var/lib/sparkdeploy/models/tiny-counting"
PROMPTS = [[100, 101, 102], [150, 151, 152]]  # token ids: the target continues 103, 104, ... / 153, 154, ...
COUNTED = np.arange(100, 200)
MAX_TOKENS = 24
HEAD_ROWS = 4096  # the model's vocab_size: rows of the full head (the tokenizer names fewer ids)
PROBE_PROMPTS = "categories:\n  count:\n    description: one message the counting model continues\n" \
                "    prompts: [\"count\"]\n"
PROBE_TOKENS = 16
PLANTED = ("listed", "missing")
BUILT = re.compile(r"shortlist head built: (\d+) rows of (\d+),.*rank rows (\d+)\.\.(\d+)")


@pytest.fixture(scope="module")
def counting_checkpoint(sim_cluster, tiny_models, tmp_path_factory) -> Path:
    """The counting model, made on this machine and copied to HOST_DIR on every node."""
    out = tmp_path_factory.mktemp("counting") / "tiny-counting"
    subprocess.run([str(require_venv()), str(COUNTING_SCRIPT), str(tiny_models / "tiny-qwen3-next-mtp"), str(out)],
                   check=True, capture_output=True, timeout=300)
    for node in sim_cluster.nodes:
        sim_cluster.ssh(node, ["sh", "-c", f"rm -rf {HOST_DIR} && mkdir -p {Path(HOST_DIR).parent}"], check=True)
        subprocess.run(["docker", "cp", str(out), f"{node.container}:{HOST_DIR}"], check=True, timeout=120)
    return out


def _profile(d: Path) -> Path:
    """The sim MTP profile serving the host checkpoint (same tokenizer, so the same model id and list rules)."""
    data = yaml.safe_load(MTP_PROFILE.read_text())
    data["description"] = "tiny Qwen3-Next + MTP with counting weights (host checkpoint), TP=2 on the sim pair"
    data["model"].update(path="/models/tiny-counting", host_dir=HOST_DIR)
    path = d / "sim-tiny-counting.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _deploy(sim, d: Path, name: str, ids: np.ndarray) -> dict:
    """`up` with the shortlist holding `ids`; per prompt the target's token ids, the drafts' acceptance, logs."""
    data = yaml.safe_load(Path(sim.inventory).read_text())
    data["profile"] = str(_profile(d))
    data["patches"]["shortlist"] = True
    # the reserve the other modules' pairs use on a shared CI host: with the default 4 GiB the memory guard
    # refused this start while the other worker's 4-node module served three pairs (MemAvailable 7.8 GiB < 8.6)
    data["memory"] = {"reserve_gib": 2.0}
    vocab = d / f"{name}.txt"
    vocab.write_text("".join(f"{i}\n" for i in ids))
    data["vocab"] = str(vocab)
    path = d / f"inventory-{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = I.load(path)
    with Context(inv, Options(ready_timeout=900, log=print)) as cluster:
        res = D.up(cluster)
    assert res.healthy, res.message
    url, headers = f"http://{inv.head.ssh.host}:{inv.ports.api}", bearer(inv.auth.api_key())
    before = metrics.scrape(url)
    outputs = []
    for prompt in PROMPTS:
        r = requests.post(f"{url}/v1/completions", headers=headers, timeout=120,
                          json={"model": inv.profile.served_name, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                "temperature": 0, "return_token_ids": True})
        r.raise_for_status()
        outputs.append(r.json()["choices"][0]["token_ids"])
    after = metrics.scrape(url)
    drafted = after.value(metrics.DRAFT_TOKENS) - before.value(metrics.DRAFT_TOKENS)
    accepted = after.value(metrics.ACCEPTED) - before.value(metrics.ACCEPTED)
    logs = {n.name: sim.ssh(n, f"docker logs {PLAIN.container} 2>&1", timeout=60).out for n in sim.nodes}
    return {"outputs": outputs, "drafted": drafted, "acceptance": accepted / drafted if drafted else None,
            "logs": logs, "size": len(ids), "inventory": path}


def live_state(sim) -> dict:
    """(current release, live list sha256, engine start time) per node, read over SSH."""
    return {n.name: (sim.ssh(n, "readlink /etc/sparkdeploy/current").out.strip(),
                     sim.ssh(n, "sha256sum /var/lib/sparkdeploy/vocab/current.txt | cut -c1-64").out.strip(),
                     sim.ssh(n, f"docker inspect -f '{{{{.State.StartedAt}}}}' {PLAIN.container}").out.strip())
            for n in sim.nodes}


def probe_acceptance(inv: Path, prompt_file: Path) -> float:
    """`sparkdeploy bench probe`'s acceptance length (1 + accepted/drafted per verify step) on the one message."""
    rc, out, err = cli("bench", "probe", "-i", str(inv), "--prompts", str(prompt_file), "--category", "count",
                       "--tokens", str(PROBE_TOKENS), "--runs", "1", "--warmup", "0", "--json", "--out",
                       str(prompt_file.with_suffix(f".{time.monotonic_ns()}.json")))
    assert rc == 0, err[-2000:]
    return json.loads(out)["metrics"]["count/acceptance_length"]["median"]


def probe_answer_ids(inv: Path) -> list[int]:
    """The token ids the served model answers the probe's message with (greedy, as the probe asks)."""
    inv_ = I.load(inv)
    r = requests.post(f"http://{inv_.head.ssh.host}:{inv_.ports.api}/v1/chat/completions",
                      headers=bearer(inv_.auth.api_key()), timeout=120,
                      json={"model": inv_.profile.served_name, "messages": [{"role": "user", "content": "count"}],
                            "max_tokens": PROBE_TOKENS, "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True})
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def runs(sim_cluster, sim_engine_image, counting_checkpoint, tmp_path_factory):
    d = tmp_path_factory.mktemp("shortlist-tp2")
    inv = I.load(Path(sim_cluster.inventory))
    tok = served_tokenizer.resolve(inv)
    ids, required = np.arange(tok.vocab_size), np.asarray(tok.required_ids)
    listed = np.union1d(np.union1d(ids[::2], COUNTED), required)
    if len(listed) % 2 == 0:  # odd: rank 0 gets one row more than rank 1 (the loader pads the rest)
        listed = np.union1d(listed, np.setdiff1d(ids, listed)[-1:])
    prompt_file = d / "probe-prompts.yaml"
    prompt_file.write_text(PROBE_PROMPTS)
    runs = {"listed": _deploy(sim_cluster, d, "listed", listed)}
    runs["listed"]["probe"] = probe_acceptance(runs["listed"]["inventory"], prompt_file)
    answer = probe_answer_ids(runs["listed"]["inventory"])
    missing = np.union1d(np.setdiff1d(ids, np.union1d(COUNTED, answer)), required)
    runs["missing"] = _deploy(sim_cluster, d, "missing", missing)
    runs["missing"]["probe"] = probe_acceptance(runs["missing"]["inventory"], prompt_file)
    runs.update(dir=d, prompts=prompt_file, probe_answer=answer)
    print({k: (r["size"], r["drafted"], r["acceptance"], r["probe"]) for k, r in runs.items() if k in PLANTED})
    return runs


def test_each_rank_builds_its_share_of_the_shortlisted_head(runs):
    shares = []
    for node, log in runs["listed"]["logs"].items():
        found = {m.groups() for m in BUILT.finditer(log)}
        assert len(found) == 1, f"{node}: expected one 'shortlist head built' line per rank, got {found}"
        rows, vocab, start, end = map(int, found.pop())
        assert (rows, vocab) == (runs["listed"]["size"], HEAD_ROWS), node
        shares.append((start, end))
        assert "shortlist head loaded" in log and "shortlist head in use" in log, node
    shares.sort()
    assert shares[0][0] == 0 and shares[0][1] == shares[1][0] and shares[1][1] == runs["listed"]["size"], shares
    assert "Using local argmax reduction" in "".join(runs["listed"]["logs"].values())


def test_acceptance_follows_whether_the_list_holds_the_drafted_ids(runs):
    listed, missing = runs["listed"], runs["missing"]
    assert listed["drafted"] > 0 and missing["drafted"] > 0  # speculation really ran both times
    assert listed["acceptance"] >= 0.9, listed["acceptance"]
    assert missing["acceptance"] <= 0.1, missing["acceptance"]


def test_the_target_still_counts_whatever_the_list(runs):
    want = [list(range(p[-1] + 1, p[-1] + 1 + MAX_TOKENS)) for p in PROMPTS]
    for name in ("listed", "missing"):
        assert runs[name]["outputs"] == want, (name, runs[name]["outputs"])


def test_a_failed_up_with_the_listed_list_then_a_reboot_keeps_drafting_from_the_missing_one(runs, sim_cluster):
    """Issue 33: the draft-list pointer moves only at the switch. The release serving the missing list is live.
    An `up` naming the listed list fails before the switch (the new image's vLLM refuses the launch:
    CompilationConfig has no mode 7); both nodes reboot; the old release comes back drafting from the list it
    was configured with, so `bench probe`'s acceptance is the missing list's figure, not the listed one's. Had
    the pointer moved at the vocab step, the rebooted engine would have found a list whose sha256 is not its
    configured one, turned the shortlist off and drafted with the full head: the listed figure."""
    listed, missing = runs["listed"]["probe"], runs["missing"]["probe"]
    assert listed > missing + 0.25, (listed, missing)  # the figure tells the two lists apart (listed holds half)
    before = live_state(sim_cluster)
    d = runs["dir"]
    raw = yaml.safe_load(runs["listed"]["inventory"].read_text())
    profile = yaml.safe_load(Path(raw["profile"]).read_text())
    profile["engine_args"] = {**(profile.get("engine_args") or {}), "compilation-config": {"mode": 7}}
    (d / "refused.profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    raw["profile"] = str(d / "refused.profile.yaml")
    (d / "refused.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    rc, out, err = cli("up", "-i", str(d / "refused.yaml"), "--no-sentinel")
    assert rc != 0 and "compilation-config" in out + err, (out + err)[-2000:]
    assert live_state(sim_cluster) == before  # the listed list is stored, not live; nothing restarted
    sim_cluster.cluster.reboot(["node1", "node2"])
    wait_healthy(runs["missing"]["inventory"], 600)  # health's draft-vocab and agreement checks among them
    assert {n: (rel, sha) for n, (rel, sha, _) in live_state(sim_cluster).items()} == \
        {n: (rel, sha) for n, (rel, sha, _) in before.items()}
    for n in sim_cluster.nodes:
        off = sim_cluster.ssh(n, f"docker logs {PLAIN.container} 2>&1 | grep -c 'shortlist DISABLED' || true").out
        assert off.split() == ["0"], f"{n.name}: the shortlist turned off after the reboot"
    after = probe_acceptance(runs["missing"]["inventory"], runs["prompts"])
    print(f"bench probe acceptance: listed {listed:.2f}, missing {missing:.2f}, after the failed up and the "
          f"reboot {after:.2f}")
    assert after == pytest.approx(missing, abs=0.05), (after, missing, listed)


LIVE_CHECK_EVERY = 4  # drafter calls between two looks at the list pointer
STREAMS = 4


def _streams(url: str, headers: dict, model: str, stop: threading.Event, tally: dict) -> None:
    """One client: streamed completions of the counted prompts until `stop`; a request is good when it streams
    to [DONE] with finish_reason "length" and the text every other request for that prompt got."""
    i = 0
    while not stop.is_set():
        prompt = PROMPTS[i % len(PROMPTS)]
        i += 1
        text, finish = "", None
        try:
            with requests.post(f"{url}/v1/completions", headers=headers, timeout=120, stream=True,
                               json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                     "stream": True}) as r:
                if r.status_code != 200:
                    tally["failed"].append(f"HTTP {r.status_code}")
                    continue
                for line in r.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    choice = json.loads(line[6:])["choices"][0]
                    text += choice.get("text") or ""
                    finish = choice.get("finish_reason") or finish
        except requests.RequestException as err:
            tally["failed"].append(str(err)[:200])
            continue
        if finish != "length" or tally["texts"].setdefault(tuple(prompt), text) != text:
            tally["truncated"].append((finish, text[:80]))
        else:
            tally["ok"] += 1


def _acceptance_window(url: str, seconds: float = 8.0) -> float:
    """accepted / drafted over a window of the clients' traffic (the engine's spec-decode counters)."""
    before = metrics.scrape(url)
    time.sleep(seconds)
    after = metrics.scrape(url)
    drafted = after.value(metrics.DRAFT_TOKENS) - before.value(metrics.DRAFT_TOKENS)
    assert drafted > 0, "no drafts in the window: speculation is not running under the load"
    return (after.value(metrics.ACCEPTED) - before.value(metrics.ACCEPTED)) / drafted


def _engine_identity(sim) -> dict:
    """Per node: the engine container's start time and its main process ID (a restart changes both)."""
    return {n.name: sim.ssh(n, ["docker", "inspect", "-f", "{{.State.StartedAt}} {{.State.Pid}}",
                                PLAIN.container]).out.strip() for n in sim.nodes}


def test_a_live_swap_to_a_poor_list_and_back_under_load_restarts_nothing_and_fails_no_request(runs, sim_cluster):
    """Issue 37 on the pair at TP=2: the head is built with room for either list (capacity) and looks at the
    pointer every few drafter calls. Under four streaming clients, `vocab rollout --live` to the list lacking the
    counted ids, then back to the list holding them: no request fails or is cut short, every output stays the
    same, neither engine restarts (same start time and PID), acceptance (the engine's counters over the clients'
    traffic) falls with the poor list and recovers with the good one, and both ranks report the list's sha. A
    list larger than the profile's capacity is refused, saying what to raise (a dry run shows it; a list larger
    than an implicit capacity, the starting list's size, goes the restart way: test_vocab_rollout_live.py)."""
    d = runs["dir"]
    inv_listed = runs["listed"]["inventory"]
    loaded = I.load(inv_listed)
    tok = served_tokenizer.resolve(loaded)
    listed_ids = np.asarray([int(x) for x in (d / "listed.txt").read_text().split()])
    missing_ids = np.asarray([int(x) for x in (d / "missing.txt").read_text().split()])
    good = rollout.write_list_with_manifest(d / "live-good.txt", listed_ids, tok)
    poor = rollout.write_list_with_manifest(d / "live-poor.txt", missing_ids, tok)
    big = rollout.write_list_with_manifest(d / "live-big.txt", np.arange(tok.vocab_size), tok)
    raw = yaml.safe_load(inv_listed.read_text())
    profile = yaml.safe_load(Path(raw["profile"]).read_text())
    profile["shortlist"] = {"capacity": int(max(len(listed_ids), len(missing_ids))),
                            "live_check_every": LIVE_CHECK_EVERY}
    (d / "live.profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    raw.update(profile=str(d / "live.profile.yaml"), vocab=str(good))
    inv = d / "live.yaml"
    inv.write_text(yaml.safe_dump(raw, sort_keys=False))
    rc, res, err = up_json(inv)
    assert rc == 0 and res["healthy"], f"{res.get('message')}\n{err[-3000:]}"
    url, headers = f"http://{loaded.head.ssh.host}:{loaded.ports.api}", bearer(loaded.auth.api_key())
    identity = _engine_identity(sim_cluster)
    tally = {"ok": 0, "failed": [], "truncated": [], "texts": {}}
    stop = threading.Event()
    clients = [threading.Thread(target=_streams, args=(url, headers, loaded.profile.served_name, stop, tally),
                                daemon=True) for _ in range(STREAMS)]
    for t in clients:
        t.start()
    try:
        acceptance = {"good": _acceptance_window(url)}
        swaps = {}
        for name, path, allow in (("poor", poor, ["--allow-lower-acceptance"]), ("good again", good, [])):
            # no speed sentinel (a speed probe under this load says nothing), short goldens: each rollout's work
            # competes with the four clients for this machine's two cores. The poor list is meant to lower
            # acceptance: its rollout is told so (its own golden figures see the fall whenever no client request
            # lands between them, and would swap it back)
            rc, out, err = cli("vocab", "rollout", str(path), "-i", str(inv), "--json", "--no-sentinel",
                               "--max-tokens", "16", *allow)
            swaps[name] = json.loads(out) if out.strip() else {"error": err[-2000:]}
            assert rc == 0 and swaps[name].get("path") == "live", (name, swaps[name], err[-2000:])
            acceptance[name] = _acceptance_window(url)
        dry_rc, out, err = cli("vocab", "rollout", str(big), "-i", str(inv), "--json", "--dry-run")
        over = json.loads(out) if out.strip() else {"error": err[-2000:]}
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=180)
    print(f"\nlive swaps under {STREAMS} streams: {tally['ok']} requests answered, {len(tally['failed'])} failed, "
          f"{len(tally['truncated'])} cut short or different; acceptance (accepted/drafted) {acceptance}; "
          f"rollout seconds {[s.get('seconds') for s in swaps.values()]}")
    assert tally["ok"] > 0 and not tally["failed"] and not tally["truncated"], (tally["failed"], tally["truncated"])
    assert _engine_identity(sim_cluster) == identity  # no engine restarted
    assert acceptance["poor"] < acceptance["good"] - 0.5 and acceptance["good again"] > acceptance["poor"] + 0.5
    assert all(s["golden_identical"] for s in swaps.values()), swaps
    rc, rep = health_json(inv)
    assert rc == 0, rep.get("failed")
    served = [c for cs in rep["checks"].values() for c in cs if c["name"] == "served list"]
    assert len(served) == 2 and all(c["status"] == "ok" for c in served), served  # both ranks: the good list
    # beyond the profile's capacity neither path can hold the list (a restart starts the same head): refused
    assert dry_rc == 1 and over.get("status") == "failed", over
    assert "exceed the draft head capacity" in over["message"] and "raise shortlist.capacity" in over["message"], over
