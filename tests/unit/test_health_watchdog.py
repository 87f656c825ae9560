"""The coupled-rank watchdog's decision function (pure): grace, wedge, zombie, backoff, cap, reset."""

import importlib.util

from sparkdeploy import paths
from tests.support import fake_nvidia_smi

_spec = importlib.util.spec_from_file_location(
    "wd", paths.repo_root() / "src/sparkdeploy/node/scripts/watchdog.py")
wd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wd)

CFG = {"start_grace_s": 100, "fail_threshold": 2, "backoff_base_s": 30, "retry_cap": 3, "stable_s": 300, "skew_s": 60}
OK = {"probe_ok": True, "health_ok": True, "head_started": 1000.0, "worker_started": 999.0}
WEDGED = {"probe_ok": False, "health_ok": True, "head_started": 1000.0, "worker_started": 999.0}
DOWN = {"probe_ok": False, "health_ok": False, "head_started": 1000.0, "worker_started": 999.0}


def test_healthy_does_nothing():
    assert wd.decide({}, OK, CFG, 2000)[0] == "none"


def test_not_ready_within_grace_waits():
    action, s, why = wd.decide({}, DOWN, CFG, 1050)
    assert action == "wait" and "starting" in why and s["failures"] == 0


def test_wedged_restarts_after_threshold_then_backs_off_then_gives_up():
    s, t = {}, 5000.0
    a, s, _ = wd.decide(s, WEDGED, CFG, t)
    assert a == "wait"  # first failure
    a, s, why = wd.decide(s, WEDGED, CFG, t + 15)
    assert a == "restart" and "wedged" in why and s["next_try"] == t + 15 + 30
    # the restart itself starts a grace: not-ready right after is "starting"
    assert wd.decide(s, dict(DOWN, head_started=t + 20), CFG, t + 40)[0] == "wait"
    a, s, _ = wd.decide(s, WEDGED, CFG, t + 200)
    a, s, _ = wd.decide(s, WEDGED, CFG, t + 215)
    assert a == "restart" and s["next_try"] == t + 215 + 60  # doubled
    for dt in (400, 415):
        a, s, _ = wd.decide(s, WEDGED, CFG, t + dt)
    assert a == "restart" and len(s["restarts"]) == 3
    for dt in (1000, 1015):
        a, s, why = wd.decide(s, WEDGED, CFG, t + dt)
    assert a == "give_up" and s["gave_up"] and "retry cap 3" in s["reason"]
    assert wd.decide(s, OK, CFG, t + 2000)[0] == "none"  # stays stopped: health reports the reason


def test_zombie_worker_after_head_restart_acts_at_once():
    obs = {"probe_ok": False, "health_ok": False, "head_started": 1000.0, "worker_started": 100.0}
    a, s, why = wd.decide({}, obs, CFG, 1050)
    assert a == "restart" and "zombie" in why


def test_a_worker_that_served_beside_an_earlier_head_is_a_zombie_however_recent_its_start():
    """The head rebooted 50 s after the worker last started (within the 60 s skew that once hid it: the grace
    then ran out before anything acted): this worker served with the old head, so restart now."""
    _, s, _ = wd.decide({}, dict(OK, head_started=1000.0, worker_started=990.0), CFG, 1020)
    assert s["served_by"] == [1000.0, 990.0]
    head_alone = {"probe_ok": False, "health_ok": False, "head_started": 1040.0, "worker_started": 990.0}
    a, s2, why = wd.decide(s, head_alone, CFG, 1045)
    assert a == "restart" and "zombie" in why, why
    # the pair it then restarts (both new) is starting, not a zombie
    both_new = {"probe_ok": False, "health_ok": False, "head_started": 1060.0, "worker_started": 1055.0}
    assert wd.decide(s2, both_new, CFG, 1070)[0] == "wait"
    # both nodes rebooted (worker first, by any amount): not a zombie either
    assert wd.decide(s, dict(both_new, worker_started=1000.5), CFG, 1070)[0] == "wait"


def test_both_rebooted_worker_later_is_not_a_zombie():
    obs = {"probe_ok": False, "health_ok": False, "head_started": 1000.0, "worker_started": 1010.0}
    assert wd.decide({}, obs, CFG, 1030)[0] == "wait"


def test_stable_period_resets_retry_count():
    s = {"restarts": [10.0, 50.0], "last_restart": 50.0, "failures": 0}
    a, s, _ = wd.decide(s, OK, CFG, 100)
    assert s["restarts"] == [10.0, 50.0]
    a, s, _ = wd.decide(s, OK, CFG, 400)
    assert s["restarts"] == []


def test_disabled_service_is_left_alone():
    assert wd.decide({}, dict(DOWN, head_enabled=False), CFG, 5000)[0] == "none"


def test_started_at_parse():
    assert wd._started("2026-11-30T12:00:00.123456789Z") == 1796040000.0
    assert wd._started("0001-01-01T00:00:00Z") is None


# ------------------------------------------------------------------------- busy at low power (issue 36 point 4)
def test_gpu_sample_reads_nvidia_smi_and_says_none_where_it_cannot(tmp_path, monkeypatch):
    """nvidia-smi here is a test double for GB10's (tests/support/fake_nvidia_smi.py)."""
    monkeypatch.setenv("PATH", str(fake_nvidia_smi.install(tmp_path / "bin", "18.52, 2405, 95")))
    assert wd.gpu_sample() == {"power_w": 18.52, "sm_clock_mhz": 2405.0, "util_pct": 95.0}
    fake_nvidia_smi.install(tmp_path / "bin", "[N/A], 2405, 95")
    assert wd.gpu_sample() == {"power_w": None, "sm_clock_mhz": 2405.0, "util_pct": 95.0}
    fake_nvidia_smi.install(tmp_path / "bin", "NVIDIA-SMI has failed", rc=9)
    assert wd.gpu_sample() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # the sim: no nvidia-smi at all
    assert wd.gpu_sample() is None


def test_busy_at_low_power_for_long_enough_restarts_the_pair_though_the_probe_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi.install(tmp_path / "bin", "18.5, 2405, 95")))
    wedged = dict(OK, gpu=wd.gpu_sample())
    cfg = dict(CFG, wedge_for_s=120)
    s, t = {}, 5000.0
    a, s, _ = wd.decide(s, wedged, cfg, t)
    assert a == "none" and s["busy_low_power_since"] == t  # busy at low power, not yet for long
    a, s, _ = wd.decide(s, wedged, cfg, t + 120)
    assert a == "wait" and s["failures"] == 1  # a failure like any other: the threshold applies
    a, s, why = wd.decide(s, wedged, cfg, t + 135)
    assert a == "restart" and "GPU busy at low power for 135 s (95 % at 18.5 W" in why
    assert s["restarts_total"] == 1 and "busy_low_power_since" not in s  # the restarted pair is judged afresh


def test_busy_at_healthy_power_idle_or_unreadable_gpu_is_no_wedge():
    s = {}
    for gpu in ({"power_w": 45.0, "sm_clock_mhz": 2400.0, "util_pct": 95.0},  # healthy decode
                {"power_w": 12.0, "sm_clock_mhz": 500.0, "util_pct": 0.0},    # idle
                {"power_w": None, "sm_clock_mhz": 2400.0, "util_pct": 95.0},  # power not reported
                None):                                                          # no nvidia-smi
        for t in (0, 500, 1000):
            a, s, _ = wd.decide(s, dict(OK, gpu=gpu), CFG, 5000.0 + t)
            assert a == "none" and "busy_low_power_since" not in s, gpu


def test_the_restart_count_is_a_counter_that_a_stable_period_does_not_reset():
    s = {"restarts": [10.0, 50.0], "last_restart": 50.0, "failures": 0, "restarts_total": 5}
    a, s, _ = wd.decide(s, OK, CFG, 400)
    assert s["restarts"] == [] and s["restarts_total"] == 5
