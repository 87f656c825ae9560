"""Is the service healthy? Checks with a verdict and a reason, per node and overall.

Node checks read one snapshot per node (one SSH round trip): docker, our unit enabled + active, stale units,
the engine container running with the release's image, MemAvailable above the reserve, boot persistence,
the watchdog's state. API checks go to the head: /health, /v1/models, a temperature-0 generation probe
that must be byte-identical to the one recorded when the release passed its gate, /metrics.

`/health` alone lies on a wedged pair (see docs/supervision.md): the generation probe is what says healthy.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable

import requests

from sparkdeploy import poll, timing
from sparkdeploy.node import memguard, probes
from sparkdeploy.node.layout import HEALTHY_MARK, SENTINEL_RECORD, ServiceLayout
from sparkdeploy.ops import vocab_live
from sparkdeploy.verdict import Status

PROBE_PROMPT = "The capital of France is"
PROBE_MAX_TOKENS = 8


@dataclass
class Check:
    name: str
    status: Status  # ok / warn / failed (the one result vocabulary, `verdict`)
    reason: str
    node: str = ""  # "" = the service as a whole

    @property
    def ok(self) -> bool:
        return self.status is not Status.FAILED

    def to_dict(self) -> dict:
        """The keys `health --json` has always printed, plus the status."""
        return {"name": self.name, "ok": self.ok, "reason": self.reason, "node": self.node,
                "status": self.status.value}


@dataclass
class NodeExpect:
    """What a node should look like (built from the plan and the current release)."""

    name: str
    role: str
    unit: str
    container: str
    image_id: str | None
    reserve_bytes: int
    release: int | None
    ports: tuple[int, ...] = ()
    extra_units: tuple[str, ...] = ()  # e.g. the watchdog timer on the head
    monitoring_units: tuple[str, ...] = ()  # those of extra_units whose failure is a warning (the exporter)


@dataclass
class ServiceExpect:
    api_url: str
    served_model: str
    nodes: list[NodeExpect]
    probe_expected: str | None = None  # recorded at the release's health gate
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token; None: the API has no key


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    vocab: dict[str, str | None] = field(default_factory=dict)  # node -> sha256 of its live draft list

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def add(self, name: str, ok: bool, reason: str, node: str = "", *, status: Status | None = None) -> Check:
        """One check: `ok` True/False is ok/failed; `status` (e.g. warn, which is still ok) overrides it."""
        c = Check(name, status if status is not None else (Status.OK if ok else Status.FAILED), reason, node)
        self.checks.append(c)
        return c

    def to_dict(self) -> dict:
        nodes: dict[str, list] = {}
        for c in self.checks:
            nodes.setdefault(c.node or "service", []).append(c.to_dict())
        return {"healthy": self.healthy, "failed": [f"{c.node or 'service'}: {c.name}: {c.reason}" for c in self.failed()],
                "checks": nodes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ------------------------------------------------------------------------------------------- node side
#: What health reads on a node, each a section of one probe (`probes.probe_script`, run by steps/healthcheck in
#: one round trip with its other reads). Shell variables (the service's layout): unit, ctr, current, wd_state,
#: vocab_dir; "$@" holds the extra units to read.
_UNIT_PROPERTIES = ("Id", "UnitFileState", "ActiveState")
NODE_SECTIONS: dict[str, str] = {
    "docker": "docker info --format '{{.ServerVersion}}' 2>/dev/null || echo DOWN",
    "units": shlex.join(probes.unit_show_argv(["docker.service"], _UNIT_PROPERTIES)) + ' "$unit" "$@" 2>/dev/null',
    "container": ("docker inspect -f '{{.State.Status}} {{.Image}} {{.State.StartedAt}} {{.RestartCount}}' \"$ctr\""
                  " 2>/dev/null || echo absent"),
    "meminfo": probes.SECTIONS["meminfo"],
    "current": 'readlink "$current" 2>/dev/null',
    "watchdog": 'cat "$wd_state" 2>/dev/null',
    "vocab": vocab_live.STATE,  # the live list and the one the release is configured with
    "healthy": f'cat "$current/{HEALTHY_MARK}" 2>/dev/null',  # the probe recorded at the release's gate
    "sentinel": f'cat "$current/{SENTINEL_RECORD}" 2>/dev/null',  # the head's speed record of the release
    "vocab_reports": vocab_live.REPORTS,  # the list each engine rank serves (vocab_live.reports)
}


def node_values(lay: ServiceLayout) -> dict[str, str]:
    """The shell variables NODE_SECTIONS read."""
    return {"unit": lay.unit, "ctr": lay.container, "wd_state": lay.watchdog_state, **vocab_live.state_values(lay)}


def snapshot(sections: dict[str, probes.Section], unit: str, extra_units: tuple[str, ...] = ()) -> dict:
    """The node snapshot `check_node` reads, from NODE_SECTIONS' output."""
    def text(name: str) -> str:
        return probes.section_text(sections, name)

    states = {u.get("Id"): u for u in probes.parse_unit_states(text("units"))}

    def state(u: str, missing: str) -> tuple[str, str]:
        st = states.get(u, {})
        return st.get("UnitFileState") or missing, st.get("ActiveState", "")

    vocab = vocab_live.parse_state("", text("vocab"))
    docker_enabled, _ = state("docker.service", "unknown")
    unit_enabled, unit_active = state(unit, "missing")
    # docker's answer is its last line: the version (the state line), or DOWN (absent) after a failing one's words
    return {"docker": (text("docker").split() or ["DOWN"])[-1],
            "docker_enabled": docker_enabled, "unit_enabled": unit_enabled, "unit_active": unit_active,
            "extra": {u: state(u, "missing") for u in extra_units},
            "container": (text("container").strip().splitlines() or [""])[-1],
            "mem": str(probes.parse_meminfo(text("meminfo")).get("MemAvailable", "")),
            "current": text("current").strip(), "watchdog": text("watchdog").replace("\n", ""),
            "vocab_pointer": vocab.pointer or "", "vocab_content": vocab.content or "",
            "vocab_configured": vocab.configured or "",
            "vocab_reports": [line for line in text("vocab_reports").splitlines() if line.strip()]}


def record(sections: dict[str, probes.Section], name: str) -> dict | None:
    """A JSON record the probe read (`healthy`, `sentinel`); None when absent or unreadable."""
    text = probes.section_text(sections, name).strip()
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def check_node(report: Report, exp: NodeExpect, snap: dict, stale: list[str]) -> None:
    n = exp.name
    docker = snap.get("docker", "DOWN")
    report.add("docker", docker not in ("", "DOWN"), f"dockerd {docker}" if docker != "DOWN" else "dockerd not answering", n)
    en, act = snap.get("unit_enabled", "missing"), snap.get("unit_active", "unknown")
    report.add("unit", en == "enabled" and act == "active", f"{exp.unit} is {en} and {act}", n)
    for u, (uen, uact) in snap.get("extra", {}).items():
        ok = uen == "enabled" and uact == "active"
        if u in exp.monitoring_units:  # monitoring, not serving: a warning
            report.add(f"unit {u}", ok, f"{u} is {uen} and {uact}" + ("" if ok else
                       f": no metrics for Prometheus; `journalctl -u {u}` on {n} says why, `up` reinstalls it"), n,
                       status=None if ok else Status.WARN)
        else:
            report.add(f"unit {u}", ok, f"{u} is {uen} and {uact}", n)
    report.add("stale units", not stale, "none" if not stale else "other enabled units run vLLM or bind our ports: "
               + ", ".join(stale), n)
    parts = snap.get("container", "").split() or ["absent"]  # no container line, or an empty one
    if parts[0] == "absent":
        report.add("container", False, f"container {exp.container} does not exist", n)
    else:
        status, image = parts[0], parts[1] if len(parts) > 1 else "?"
        img_ok = exp.image_id is None or image == exp.image_id
        report.add("container", status == "running" and img_ok,
                   f"{exp.container} {status} with image {image[:19]}"
                   + ("" if img_ok else f", expected release image {exp.image_id[:19]}"), n)
    try:
        mem = int(float(snap.get("mem") or 0))
    except ValueError:
        mem = 0
    margin = memguard.serving_margin(n, mem, exp.reserve_bytes)  # below the reserve fails; a thin margin warns
    warning = f" -- warning: {margin.fix}" if margin.status is Status.WARN else ""
    report.add("memory", margin.ok, margin.reason + warning, n, status=margin.status)
    cur = snap.get("current", "")
    want = f"releases/{exp.release:04d}" if exp.release is not None else None
    boot_ok = en == "enabled" and snap.get("docker_enabled") == "enabled" and bool(cur) and (want is None or cur == want)
    report.add("boot persistence", boot_ok,
               f"unit {en}, docker.service {snap.get('docker_enabled')}, current -> {cur or 'nothing'}"
               + ("" if want is None or cur == want else f" (expected {want})"), n)
    vocab_live.check(report, n, snap)
    wd = snap.get("watchdog")
    if wd:
        try:
            state = json.loads(wd)
        except ValueError:
            state = {}
        if state.get("gave_up"):
            report.add("watchdog", False, f"supervisor stopped the service: {state.get('reason', 'retry cap reached')}", n)


# -------------------------------------------------------------------------------------------- API side
def bearer(api_key: str | None) -> dict[str, str]:
    """The header every caller of the OpenAI routes sends (vLLM guards /v1/* when VLLM_API_KEY is set)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def generate(api_url: str, model: str, *, timeout: float = 30, prompt: str = PROBE_PROMPT,
             max_tokens: int = PROBE_MAX_TOKENS, api_key: str | None = None) -> str:
    """A short temperature-0 completion; returns its text (raises requests errors / ValueError)."""
    r = requests.post(f"{api_url}/v1/completions", timeout=timeout, headers=bearer(api_key),
                      json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


class NotAnswering(Exception):
    """The service did not answer within the wait; `last` is what was seen last."""

    def __init__(self, last: str):
        super().__init__(last)
        self.last = last


def wait_answering(api_url: str, model: str, *, timeout: float, probe_timeout: float = 30,
                   log: Callable[[str], None] = print, every: Callable[[], None] | None = None,
                   every_s: float = 10.0, poll_s: float = 2.0, api_key: str | None = None) -> str:
    """Poll `/health` until it answers 200 and a temperature-0 completion comes back; return its text.

    Progress goes to `log` every 15 s; `every` (e.g. "are the ranks still up?") runs every `every_s` s and may
    raise to stop the wait early. Raises NotAnswering after `timeout` s. Timed as a "wait" span (sparkdeploy.timing)."""
    with timing.span("wait", f"{api_url} answering"):
        return _poll_answering(api_url, model, timeout=timeout, probe_timeout=probe_timeout, log=log, every=every,
                               every_s=every_s, poll_s=poll_s, api_key=api_key)


def _poll_answering(api_url: str, model: str, *, timeout: float, probe_timeout: float,
                    log: Callable[[str], None], every: Callable[[], None] | None, every_s: float, poll_s: float,
                    api_key: str | None) -> str:
    def attempt() -> str:
        try:
            r = requests.get(f"{api_url}/health", timeout=5)
            if r.status_code == 200:
                return generate(api_url, model, timeout=probe_timeout, api_key=api_key)
            raise poll.NotYet(f"/health HTTP {r.status_code}")
        except (requests.RequestException, ValueError, KeyError) as err:
            raise poll.NotYet(type(err).__name__) from None

    try:
        return poll.until(attempt, timeout=timeout, interval=poll_s, side=every, side_every=every_s,
                          note=lambda el, last: log(f"waiting for {api_url} ({el:.0f}/{timeout:.0f} s): {last}"))
    except poll.TimedOut as out:
        raise NotAnswering(out.last) from None


def check_api_key(report: Report, exp: ServiceExpect) -> None:
    """With a key, a request without it must get 401; without one, warn: rank 0 listens on every interface."""
    if exp.api_key is None:
        report.add("api key", True, f"{exp.api_url} answers anyone who can reach it -- warning: set "
                                    "auth.api_key_file in the inventory (README: adding an API key)")
        return
    try:
        code = requests.get(f"{exp.api_url}/v1/models", timeout=5).status_code
    except requests.RequestException as err:
        report.add("api key", False, f"no answer from {exp.api_url}: {type(err).__name__}")
        return
    report.add("api key", code == 401, "a request without the key is refused (HTTP 401)" if code == 401 else
               f"a request without the key got HTTP {code}, expected 401: the engine is not using the key")


def check_api(report: Report, exp: ServiceExpect, *, probe_timeout: float = 30) -> str | None:
    """API checks on the head; returns the probe text (None if the probe failed)."""
    try:
        r = requests.get(f"{exp.api_url}/health", timeout=5)
        report.add("/health", r.status_code == 200, f"HTTP {r.status_code}")
    except requests.RequestException as err:
        report.add("/health", False, f"no answer from {exp.api_url}: {type(err).__name__}")
        report.add("generation", False, "skipped: API not answering")
        return None
    check_api_key(report, exp)
    try:
        r = requests.get(f"{exp.api_url}/v1/models", timeout=5, headers=bearer(exp.api_key))
        ids = [m.get("id") for m in r.json().get("data", [])]
        report.add("/v1/models", exp.served_model in ids, f"serves {ids}")
    except (requests.RequestException, ValueError) as err:
        report.add("/v1/models", False, f"{type(err).__name__}: {err}")
    text = None
    t0 = time.monotonic()
    try:
        text = generate(exp.api_url, exp.served_model, timeout=probe_timeout, api_key=exp.api_key)
        dt = time.monotonic() - t0
        if exp.probe_expected is None:
            report.add("generation", True, f"answered in {dt:.2f} s (no recorded probe to compare)")
        else:
            same = text == exp.probe_expected
            report.add("generation", same, f"answered in {dt:.2f} s, " + (
                "byte-identical to the probe recorded at deploy" if same else
                f"DIFFERS from the recorded probe: got {text!r}, recorded {exp.probe_expected!r}"))
    except (requests.RequestException, ValueError, KeyError) as err:
        report.add("generation", False, f"temperature-0 probe failed after {time.monotonic() - t0:.1f} s: "
                   f"{type(err).__name__}: {str(err)[:200]}")
    try:
        r = requests.get(f"{exp.api_url}/metrics", timeout=5)
        n = sum(1 for line in r.text.splitlines() if line.startswith("vllm:"))
        report.add("metrics", r.status_code == 200 and n > 0, f"{n} vllm: samples")
    except requests.RequestException as err:
        report.add("metrics", False, f"{type(err).__name__}")
    return text


# ------------------------------------------------------------------------------------------------ router
def check_router(rp, api_key: str | None, *, probe_timeout: float = 30) -> Report:
    """The router end to end (`rp`: sparkdeploy.plan.router.RouterPlan): it refuses a request without the key,
    lists every service's model, and answers each model with what that service's head answers itself (a
    temperature-0 completion both ways: the same text and model name, so the request reached that service)."""
    report = Report()
    where = rp.node.name
    try:
        code = requests.get(f"{rp.url}/v1/models", timeout=5).status_code
        report.add("router key", code == 401, "a request without the key is refused (HTTP 401)" if code == 401 else
                   f"a request without the key got HTTP {code}, expected 401", where)
        r = requests.get(f"{rp.url}/v1/models", timeout=5, headers=bearer(api_key))
        listed = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else []
        missing = [m for m in rp.models if m not in listed]
        report.add("router models", not missing, f"lists {listed}" + (f"; MISSING {missing}" if missing else ""),
                   where)
    except (requests.RequestException, ValueError) as err:
        report.add("router", False, f"no answer from {rp.url}: {type(err).__name__}", where)
        return report
    for w in rp.workers:
        name = f"via router: {w.model}" + (f" ({w.key})" if w.key != w.service else "")  # one per replica
        t0 = time.monotonic()
        try:
            r = requests.post(f"{rp.url}/v1/completions", timeout=probe_timeout, headers=bearer(api_key), json={
                "model": w.model, "prompt": PROBE_PROMPT, "max_tokens": PROBE_MAX_TOKENS, "temperature": 0, "seed": 0})
            dt = time.monotonic() - t0
            if r.status_code != 200:
                report.add(name, False, f"HTTP {r.status_code} from the router: {r.text[:200]}", where)
                continue
            body = r.json()
            text, model = body["choices"][0]["text"], body.get("model")
            direct = generate(w.url, w.model, timeout=probe_timeout, api_key=api_key)
            same = text == direct and model == w.model
            report.add(name, same, f"answered in {dt:.2f} s, " + (
                f"the same as service {w.key} answers directly" if same else
                f"DIFFERS from service {w.key}'s own answer: {model!r} {text!r} vs {direct!r}"), where)
        except (requests.RequestException, ValueError, KeyError) as err:
            report.add(name, False, f"{type(err).__name__}: {str(err)[:200]}", where)
    return report
