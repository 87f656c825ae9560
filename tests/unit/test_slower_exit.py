"""A slower deploy fails (issue 36 point 5): `up` and `rollback` exit 3 when the sentinel's verdict on the release
they put live is a regression beyond noise, 0 with --allow-slower, and the release is left serving. The cluster's
own work (connect, start, gate) is the part replaced here: its result and the sentinel's verdict are data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkdeploy.cli import deploy as deploy_cli
from sparkdeploy.cli import main
from sparkdeploy.cli.options import SLOWER, deploy_exit_code
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.context import Context
from sparkdeploy.steps.up import UpResult

FIXTURES = Path(__file__).parent / "fixtures"
SLOWER_VERDICT = {"against": 6, "regression": True, "categories": ["code"],
                  "text": "SPEED REGRESSION against release 6: code: decode_tok_s fell 33.2 -> 27.6"}
QUIET_VERDICT = {"against": 6, "regression": False, "text": "no regression beyond noise against release 6"}
NOT_MEASURED = {"against": None, "regression": False, "text": "not measured: connection refused"}


@pytest.mark.parametrize("served, speeds, allow, code", [
    (True, [QUIET_VERDICT], False, 0),
    (True, [None], False, 0),                      # --no-sentinel, or nothing restarted
    (True, [NOT_MEASURED], False, 0),              # a probe that failed is reported, not a regression
    (True, [SLOWER_VERDICT], False, SLOWER),
    (True, [QUIET_VERDICT, SLOWER_VERDICT], False, SLOWER),  # one slower service of several
    (True, [SLOWER_VERDICT], True, 0),
    (False, [SLOWER_VERDICT], True, 1),             # a release that does not serve is a failure, slower or not
])
def test_the_exit_code_says_served_failed_or_slower(served, speeds, allow, code):
    assert deploy_exit_code(served, speeds, allow) == code


@pytest.fixture
def inventory(tmp_path):
    for name in ("inventory.sim.yaml", "vocab-1k.txt"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    return str(tmp_path / "inventory.sim.yaml")


@pytest.fixture
def served_release_7(monkeypatch):
    """`up` and `rollback` put release 7 live and it passed its gate; the sentinel's verdict is set per test."""
    live = UpResult(release=7, restarted=True, healthy=True, message="release 7 is live")
    monkeypatch.setattr(D, "up", lambda cx: live)
    monkeypatch.setattr(D, "rollback", lambda cx, to: live)
    verdict = {}
    monkeypatch.setattr(deploy_cli, "speed_after_gate", lambda cluster, number, log, against=None: verdict["v"])
    monkeypatch.setattr(D.releases, "read_sentinel", lambda conn, lay, number: None)
    monkeypatch.setattr(Context, "conn", lambda self, name: None)
    return verdict


@pytest.mark.parametrize("command", [["up"], ["rollback", "6"]])
@pytest.mark.parametrize("verdict, flags, code", [
    (SLOWER_VERDICT, [], SLOWER),
    (SLOWER_VERDICT, ["--allow-slower"], 0),
    (QUIET_VERDICT, [], 0),
])
def test_up_and_rollback_exit_with_the_sentinels_verdict(inventory, served_release_7, command, verdict, flags, code,
                                                         capsys):
    served_release_7["v"] = verdict
    assert main([*command, "-i", inventory, *flags]) == code
    err = capsys.readouterr().err
    assert "release 7 is live" in err
    if verdict["regression"]:
        assert "SPEED REGRESSION against release 6" in err and "the release serves" in err
        assert ("accepted (--allow-slower)" if flags else f"exit {SLOWER}") in err


def test_no_sentinel_leaves_a_served_release_at_exit_0(inventory, served_release_7):
    served_release_7["v"] = SLOWER_VERDICT  # would be slower, but nothing is measured
    assert main(["up", "-i", inventory, "--no-sentinel"]) == 0
