"""The coupled-rank watchdog's decision function (pure): grace, wedge, zombie, backoff, cap, reset."""

import importlib.util

from sparkdeploy import paths

_spec = importlib.util.spec_from_file_location(
    "wd", paths.repo_root() / "src/sparkdeploy/steps/node_files/watchdog.py")
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
