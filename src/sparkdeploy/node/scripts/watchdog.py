#!/usr/bin/env python3
"""sparkdeploy coupled-rank watchdog: runs on the head from a systemd timer (stdlib only; copied to the node).

Each tick: is the engine serving? Completions counted since the last tick prove it (no probe is added to
real traffic, so a benchmark's counter deltas stay clean); with none, probe a real short completion on the
local API. A GPU that stays busy at low power (a hung kernel spins at ~95 % utilization and 16-27 W against
~45 W healthy on GB10: eugr/spark-vllm-docker#260) is wedged too, where `nvidia-smi` answers. If the pair is
wedged or a rank died, restart
BOTH ranks, workers first, head last, with exponential backoff and a retry cap; after the cap, stop the
service and record why (read by `sparkdeploy health`). Design and reasons: docs/supervision.md.

Usage: watchdog.py CONFIG.json          (one tick; the timer calls it again)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

STATE = "/var/lib/sparkdeploy/watchdog.json"

DEFAULTS = {
    "probe_timeout_s": 20,  # one short completion; a healthy engine answers in well under a second
    "start_grace_s": 900,  # readiness can take many minutes (load, JIT): not-ready within this is "starting"
    "skew_s": 60,  # head started this much later than a still-running worker: the worker is a zombie
    "fail_threshold": 2,  # consecutive failed ticks before acting (one slow answer is not a death)
    "backoff_base_s": 30,  # wait after restart k: base * 2**(k-1)
    "backoff_max_s": 600,
    "retry_cap": 4,  # restarts within one unstable period; then stop and say why
    "stable_s": 600,  # healthy this long after a restart: the retry count starts over
    # busy at low power this long is a wedge (inventory `watchdog:`; defaults from the field report: a hung
    # kernel reads ~95 % at 16-27 W, a healthy GB10 ~45 W)
    "wedge_util_pct": 90,
    "wedge_power_w": 30,
    "wedge_for_s": 120,
}
GPU_QUERY = ("power.draw", "clocks.sm", "utilization.gpu")  # GB10 reports these; it has no memory fields
GPU_KEYS = ("power_w", "sm_clock_mhz", "util_pct")


# ------------------------------------------------------------------------------------------ decision (pure)
def decide(state: dict, obs: dict, cfg: dict, now: float) -> tuple[str, dict, str]:
    """Return (action, new_state, why). action: none | wait | restart | give_up.

    obs: probe_ok (bool), health_ok (bool), head_started (epoch or None), worker_started (epoch or None,
    None if unknown or no worker), head_enabled (bool: the operator has not run `down`), gpu (`gpu_sample()`,
    None where nvidia-smi does not answer).
    """
    c = dict(DEFAULTS, **cfg)
    s = dict(state)
    s.setdefault("restarts", [])
    s.setdefault("failures", 0)
    if s.get("gave_up"):
        return "none", s, "gave up earlier: " + s.get("reason", "")
    if not obs.get("head_enabled", True):
        return "none", s, "service disabled (down): not supervising"
    busy_low = busy_at_low_power(s, obs.get("gpu"), c, now)
    hs, ws = obs.get("head_started"), obs.get("worker_started")
    if obs.get("probe_ok") and not busy_low:
        s["failures"] = 0
        s["last_ok"] = now
        if hs and ws:
            s["served_by"] = [hs, ws]  # the ranks that formed this serving pair (see `zombie` below)
        if s["restarts"] and now - s.get("last_restart", 0) >= c["stable_s"]:
            s["restarts"] = []
        return "none", s, "probe ok"
    # Not answering a real completion. Is it just starting?
    started = max([t for t in (obs.get("head_started"), s.get("last_restart")) if t] or [0])
    # A worker that served beside an earlier head never rejoins a new one: the head restarted alone (a head
    # reboot, a crash systemd restarted). Known for certain when this worker served with another head; else
    # guessed from a head that started well after a still-running worker and is not ready 45 s on.
    formed_before = s.get("served_by") or [None, None]
    zombie = bool(hs and ws and not obs.get("health_ok") and (
        (ws == formed_before[1] and hs != formed_before[0])
        or (hs - ws > c["skew_s"] and now - hs > 45)))
    if not obs.get("health_ok") and started and now - started < c["start_grace_s"] and not zombie:
        return "wait", s, f"starting ({now - started:.0f} s of {c['start_grace_s']} s grace)"
    s["failures"] += 1
    why = ("worker outlived a head restart (zombie rank)" if zombie else busy_low if busy_low else
           "API answers /health but not a completion (wedged)" if obs.get("health_ok") else
           "API not answering after the start grace")
    s["last_failure"] = why
    if s["failures"] < c["fail_threshold"] and not zombie:
        return "wait", s, f"{why}; failure {s['failures']}/{c['fail_threshold']}"
    if now < s.get("next_try", 0):
        return "wait", s, f"{why}; backing off until {time.strftime('%H:%M:%S', time.localtime(s['next_try']))}"
    if len(s["restarts"]) >= c["retry_cap"]:
        s["gave_up"] = True
        s["reason"] = f"{why}; {len(s['restarts'])} coupled restarts did not bring it back (retry cap {c['retry_cap']})"
        s["gave_up_at"] = now
        return "give_up", s, s["reason"]
    s["restarts"].append(now)
    k = len(s["restarts"])
    s["last_restart"] = now
    s["restarts_total"] = s.get("restarts_total", 0) + 1  # never forgotten: Prometheus' counter of restarts
    s.pop("busy_low_power_since", None)  # the restarted pair is judged afresh
    s["next_try"] = now + min(c["backoff_max_s"], c["backoff_base_s"] * 2 ** (k - 1))
    s["failures"] = 0
    return "restart", s, f"{why}; coupled restart {k}/{c['retry_cap']}"


def busy_at_low_power(s: dict, gpu: dict | None, c: dict, now: float) -> str | None:
    """Why the GPU counts as wedged (busy at low power for `wedge_for_s`), else None; keeps when it began in
    `s["busy_low_power_since"]`. An unreadable GPU (the sim, a field nvidia-smi leaves [N/A]) is never busy."""
    util, power = (gpu or {}).get("util_pct"), (gpu or {}).get("power_w")
    if util is None or power is None or util < c["wedge_util_pct"] or power >= c["wedge_power_w"]:
        s.pop("busy_low_power_since", None)
        return None
    since = s.setdefault("busy_low_power_since", now)
    if now - since < c["wedge_for_s"]:
        return None
    return (f"GPU busy at low power for {now - since:.0f} s ({util:.0f} % at {power:.1f} W; under "
            f"{c['wedge_power_w']} W at >= {c['wedge_util_pct']} % is a hung kernel) (wedged)")


# ------------------------------------------------------------------------------------------------ effects
def gpu_sample(timeout: float = 10) -> dict | None:
    """Power (W), SM clock (MHz) and utilization (%) of the node's GPU from `nvidia-smi` (a field it reports as
    [N/A] is None); None where nvidia-smi is absent, fails or hangs (a wedged GPU can hang it)."""
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = [f.strip() for f in (r.stdout.splitlines() or [""])[0].split(",")]
    if r.returncode != 0 or len(fields) != len(GPU_KEYS):
        return None
    sample = {}
    for key, text in zip(GPU_KEYS, fields):
        try:
            sample[key] = float(text)
        except ValueError:
            sample[key] = None
    return sample if any(v is not None for v in sample.values()) else None


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save(path: str, state: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, sort_keys=True)
    os.replace(tmp, path)


def api_key(secrets_env: str | None) -> str | None:
    """VLLM_API_KEY from the root-only env file the engine reads too (the key never sits in the config)."""
    try:
        with open(secrets_env or "") as f:
            for line in f:
                if line.startswith("VLLM_API_KEY="):
                    return line.rstrip("\n").split("=", 1)[1] or None
    except OSError:
        pass
    return None


def _http(url: str, body: dict | None, timeout: float, key: str | None = None) -> bool:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if r.status != 200:
                return False
            if body is not None:
                return bool(json.loads(r.read()).get("choices"))
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def served_total(api: str) -> float | None:
    """Sum of `vllm:request_success_total` over its labels, or None when /metrics cannot be read."""
    try:
        with urllib.request.urlopen(f"{api}/metrics", timeout=5) as r:
            text = r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    values = [line.rsplit(" ", 1)[-1] for line in text.splitlines() if line.startswith("vllm:request_success_total")]
    try:
        return sum(float(v) for v in values) if values else None
    except ValueError:
        return None


def probe_api(api: str, model: str, last_total: float | None, timeout: float, key: str | None = None) -> dict:
    """health_ok, probe_ok, probed (False: completions since `last_total` already proved it) and served_total
    (read after our own probe, so the next tick does not take the probe for traffic)."""
    out = {"health_ok": _http(f"{api}/health", None, 5), "probe_ok": False, "probed": False, "served_total": None}
    if not out["health_ok"]:
        return out
    total = served_total(api)
    if total is not None and last_total is not None and total > last_total:
        out.update(probe_ok=True, served_total=total)
        return out
    out["probed"] = True
    out["probe_ok"] = _http(f"{api}/v1/completions",
                            {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}, timeout, key)
    out["served_total"] = served_total(api)
    return out


def _started(text: str) -> float | None:
    """docker's StartedAt (RFC 3339, nanoseconds) -> epoch seconds."""
    text = text.strip()
    if not text or text.startswith("0001-"):
        return None
    import datetime as dt

    base = text.split(".")[0].rstrip("Z")
    try:
        return dt.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return None


def _container_started(name: str) -> float | None:
    r = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}} {{.State.StartedAt}}", name],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.startswith("true"):
        return None
    return _started(r.stdout.split()[1])


def _worker(cfg: dict, w: dict, verb: str, timeout: float = 120) -> subprocess.CompletedProcess:
    argv = ["ssh", "-i", cfg["ssh_key"], "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={cfg['known_hosts']}", "-o", "ConnectTimeout=10",
            "-p", str(w.get("port", 22)), f"{w.get('user', 'root')}@{w['host']}", verb]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", "timeout")


def _log(msg: str) -> None:
    print(msg, flush=True)  # journald via the service's stdout


def observe(cfg: dict, last_total: float | None) -> dict:
    c = dict(DEFAULTS, **cfg)
    obs = {"head_enabled": subprocess.run(["systemctl", "is-enabled", "--quiet", cfg["unit"]]).returncode == 0}
    obs.update(probe_api(cfg["api_url"], cfg["model"], last_total, c["probe_timeout_s"],
                         api_key(cfg.get("secrets_env"))))
    obs["head_started"] = _container_started(cfg["container"])
    ws = []
    for w in cfg.get("workers", []):
        r = _worker(cfg, w, "status", 30)
        parts = r.stdout.split()
        ws.append(_started(parts[1]) if r.returncode == 0 and len(parts) == 2 and parts[0] == "true" else None)
    obs["worker_started"] = min([t for t in ws if t] or [0]) or None
    obs["ranks_down"] = [n for n, t in [("head", obs["head_started"])] +
                         [(w.get("name", w["host"]), t) for w, t in zip(cfg.get("workers", []), ws)] if t is None]
    obs["gpu"] = gpu_sample()
    return obs


def act(cfg: dict, action: str) -> None:
    unit = cfg["unit"]
    if action == "restart":
        # Stop the head first (it holds the rendezvous), restart workers, then start the head.
        subprocess.run(["systemctl", "stop", unit])
        for w in cfg.get("workers", []):
            r = _worker(cfg, w, "restart")
            _log(f"worker {w['host']} restart: rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
        subprocess.run(["systemctl", "start", "--no-block", unit])
    elif action == "give_up":
        subprocess.run(["systemctl", "stop", unit])
        for w in cfg.get("workers", []):
            _worker(cfg, w, "stop")


def tick(cfg_path: str, state_path: str = STATE) -> str:
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("settings"):
        cfg = {**_load(cfg["settings"]), **cfg}
    state = _load(state_path)
    if state.get("release") != cfg.get("release"):
        # a new release starts with a clean slate; the count of restarts is a counter and goes on
        state = {"release": cfg.get("release"), "restarts_total": state.get("restarts_total", 0)}
    obs = observe(cfg, state.get("served_total"))
    action, state, why = decide(state, obs, cfg, time.time())
    state["served_total"] = obs["served_total"]
    state["ranks_down"] = obs["ranks_down"]  # the exporter's rank-down figure
    state["gpu"] = dict(obs["gpu"], at=time.time()) if obs["gpu"] else None  # the exporter's power figures
    state["last_tick"] = time.time()
    state["last_action"] = action
    state["last_why"] = why
    _save(state_path, state)
    if action != "none":
        _log(f"{action}: {why}")
    act(cfg, action)
    return action


if __name__ == "__main__":
    tick(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else STATE)
