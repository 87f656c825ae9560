"""Prometheus metrics people can graph, served from the head: the watchdog's verdicts, restarts, give-ups, ranks
down and GPU power (its state file, read only: the watchdog stays stdlib-only and knows nothing of Prometheus),
the release serving now, the sentinel's figures per category, the engine's spec-decode and token counters, and
the host's memory margin.

Every series carries the labels `service` and `node` (`--service`, `--node`), so one Prometheus scraping the
exporter of every service head keeps them apart. Counters are relayed as counters: PromQL computes the rates
(live acceptance length is `1 + rate(accepted) / rate(drafts)`, joules per token is power over the rate of
generated tokens: deploy/monitoring/rules.yml records both), so the exporter keeps nothing between scrapes and
any number of scrapers read the same figures.

`families()` turns what was read into metric families and does nothing else, so every figure is testable
from a dict; `Exporter` reads its inputs on each scrape (an input it cannot read shows as
`sparkdeploy_exporter_source_up{source=...} 0`, not as an error page); `python -m sparkdeploy.checks.exporter`
serves it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sparkdeploy.bench import metrics, sentinel, stats
from sparkdeploy.errors import BenchError, InputError
from sparkdeploy.node import layout

DEFAULT_PORT = 9466
ACTIONS = ("none", "wait", "restart", "give_up")  # the watchdog's decide() outcomes
SOURCES = ("watchdog_state", "release", "sentinel", "engine", "memory")
GIB = 1024 ** 3
# The engine's counters relayed under our names (labels: position for the per-position one).
ENGINE_COUNTERS = (
    ("sparkdeploy_engine_drafts", metrics.DRAFTS, "Verify steps that carried a draft (vLLM's counter)."),
    ("sparkdeploy_engine_draft_tokens", metrics.DRAFT_TOKENS, "Draft tokens proposed (vLLM's counter)."),
    ("sparkdeploy_engine_accepted_tokens", metrics.ACCEPTED, "Draft tokens accepted (vLLM's counter)."),
    ("sparkdeploy_engine_generation_tokens", metrics.GENERATION_TOKENS, "Tokens generated (vLLM's counter)."),
    ("sparkdeploy_engine_requests_succeeded", metrics.SUCCESS, "Requests finished (vLLM's counter)."),
)


def families(*, identity: dict[str, str], state: dict | None, release: int | None, record: dict | None,
             engine: metrics.Snapshot | None, memory: dict | None = None) -> list:
    """All metric families from what was read (None: that input could not be read), every sample labelled
    with `identity` (service, node)."""
    out = [_gauge("sparkdeploy_exporter_source_up", "1 when the exporter could read this input on this scrape.",
                  [(("source",), (s,), float(ok)) for s, ok in zip(
                      SOURCES, (state is not None, release is not None, record is not None, engine is not None,
                                memory is not None))])]
    if release is not None:
        out.append(_gauge("sparkdeploy_release_number", "The release `current` points at on the head.",
                          [((), (), release)]))
    if state is not None:
        out += _watchdog(state) + _gpu(state.get("gpu"))
    if record is not None:
        out += _sentinel(record)
    if engine is not None:
        out += _engine(engine)
    if memory is not None:
        out += _memory(memory)
    for fam in out:
        fam.samples = [s._replace(labels={**identity, **s.labels}) for s in fam.samples]
    return out


def _watchdog(state: dict) -> list:
    last = state.get("last_action")
    fams = [
        _gauge("sparkdeploy_watchdog_verdict", "1 for the action the watchdog's last tick decided, 0 for the others.",
               [(("action",), (a,), float(a == last)) for a in ACTIONS]),
        _gauge("sparkdeploy_watchdog_failures", "Consecutive failed ticks (the watchdog acts at its threshold).",
               [((), (), float(state.get("failures", 0)))]),
        _gauge("sparkdeploy_watchdog_unstable_restarts", "Coupled restarts in the current unstable period (what "
               "the retry cap counts; forgotten once the engine stayed healthy long enough).",
               [((), (), float(len(state.get("restarts", []))))]),
        _counter("sparkdeploy_watchdog_restarts", "Coupled restarts the watchdog made (increase() over a window).",
                 float(state.get("restarts_total", 0))),
        _gauge("sparkdeploy_watchdog_gave_up", "1 when the watchdog gave up after its retry cap and stopped the "
               "service.", [((), (), float(bool(state.get("gave_up"))))]),
        _gauge("sparkdeploy_watchdog_ranks_down", "Ranks (head and workers) whose engine container was not running "
               "at the watchdog's last tick.", [((), (), float(len(state.get("ranks_down") or [])))]),
        _gauge("sparkdeploy_watchdog_busy_at_low_power", "1 while the watchdog sees the GPU busy at low power (its "
               "inventory thresholds): a hung kernel, a restart once it lasts `watchdog.wedge_for_s`.",
               [((), (), float("busy_low_power_since" in state))]),
    ]
    times = {"last_tick": "its last tick", "last_ok": "the engine last answered a completion",
             "last_restart": "its last coupled restart", "gave_up_at": "it gave up",
             "busy_low_power_since": "the GPU became busy at low power"}
    for key, what in times.items():
        if isinstance(state.get(key), (int, float)):
            name = "sparkdeploy_watchdog_gave_up_timestamp_seconds" if key == "gave_up_at" else \
                f"sparkdeploy_watchdog_{key}_timestamp_seconds"
            fams.append(_gauge(name, f"When {what} (Unix time).", [((), (), float(state[key]))]))
    return fams


def _gpu(gpu: dict | None) -> list:
    """The GPU figures the watchdog read from nvidia-smi at its last tick (none where nvidia-smi does not answer;
    GB10 reports power, SM clock and utilization, no memory)."""
    if not isinstance(gpu, dict):
        return []
    figures = (("power_w", "sparkdeploy_gpu_power_watts", "GPU power draw (W).", 1, 1),
               ("sm_clock_mhz", "sparkdeploy_gpu_sm_clock_hertz", "GPU SM clock (Hz).", 1e6, 1),
               ("util_pct", "sparkdeploy_gpu_utilization_ratio", "GPU utilization (0-1).", 1, 100),
               ("at", "sparkdeploy_gpu_sample_timestamp_seconds", "When the watchdog read the GPU (Unix time).", 1, 1))
    return [_gauge(name, doc, [((), (), float(gpu[key]) * times / per)])
            for key, name, doc, times, per in figures if isinstance(gpu.get(key), (int, float))]


def _sentinel(record: dict) -> list:
    """Medians of each category's repeats, as the sentinel compares them, and its verdict."""
    length, speed, pos = [], [], []
    for cat, figs in record["categories"].items():
        if figs.get("acceptance_length"):
            length.append((("category",), (cat,), _median(figs["acceptance_length"])))
        if figs.get("decode_tok_s"):
            speed.append((("category",), (cat,), _median(figs["decode_tok_s"])))
        pos += [(("category", "position"), (cat, str(i)), _median(v))
                for i, v in enumerate(figs.get("accept_pos", [])) if v]
    fams = [
        _gauge("sparkdeploy_sentinel_acceptance_length", "Sentinel probe: mean acceptance length (tokens per "
               "verify step), median of the repeats.", length),
        _gauge("sparkdeploy_sentinel_accept_position", "Sentinel probe: share of drafts accepted at this "
               "position, median of the repeats.", pos),
        _gauge("sparkdeploy_sentinel_decode_tokens_per_second", "Sentinel probe: decode tok/s of one stream, "
               "median of the repeats.", speed),
    ]
    number = record.get("release", {}).get("number")
    if isinstance(number, int):
        fams.append(_gauge("sparkdeploy_sentinel_release_number", "The release the sentinel record measured.",
                           [((), (), number)]))
    verdict = record.get("verdict")
    if isinstance(verdict, dict):
        fams.append(_gauge("sparkdeploy_sentinel_regression", "1 when the sentinel found the serving release "
                           "slower than the one before beyond noise.", [((), (), float(bool(verdict.get("regression"))))]))
    return fams


def _engine(snap: metrics.Snapshot) -> list:
    """The engine's counters as they stand (vLLM's own totals: a restart resets them, which rate() knows)."""
    fams = [_counter(name, doc, snap.value(source)) for name, source, doc in ENGINE_COUNTERS if snap.has(source)]
    positions = snap.label_values(metrics.ACCEPTED_PER_POS, "position")
    if positions:
        fam = CounterMetricFamily("sparkdeploy_engine_accepted_tokens_per_position",
                                  "Draft tokens accepted at this position (vLLM's counter).", labels=("position",))
        for p in positions:
            fam.add_metric([p], snap.value(metrics.ACCEPTED_PER_POS, position=p))
        fams.append(fam)
    return fams


def _memory(mem: dict) -> list:
    fams = [_gauge("sparkdeploy_memory_available_bytes", "The head's MemAvailable (GB10: CPU and GPU share it).",
                   [((), (), float(mem["available"]))])]
    if mem.get("reserve"):
        fams.append(_gauge("sparkdeploy_memory_reserve_bytes", "The host reserve the plan keeps out of the engine's "
                           "budget (inventory memory.reserve_gib); MemAvailable below it starves the host.",
                           [((), (), float(mem["reserve"]))]))
    return fams


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc)
    fam.add_metric([], value)
    return fam


def _gauge(name: str, doc: str, samples: list[tuple[tuple, tuple, float]]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=samples[0][0] if samples else ())
    for _, values, value in samples:
        fam.add_metric(list(values), value)
    return fam


def _median(values: list[float]) -> float:
    return stats.summarize(values).median


# ------------------------------------------------------------------------------------------------- reading
def read_json(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def release_number(current_link: str) -> int | None:
    """The number of the release directory `current` resolves to (releases/NNNN)."""
    try:
        return int(Path(os.path.realpath(current_link)).name)
    except ValueError:
        return None


def memory(meminfo: str = "/proc/meminfo", reserve_gib: float | None = None) -> dict | None:
    """MemAvailable in bytes (and the plan's reserve), or None when /proc/meminfo cannot be read."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return {"available": int(line.split()[1]) * 1024,
                        "reserve": int(reserve_gib * GIB) if reserve_gib else None}
    except (OSError, ValueError, IndexError):
        pass
    return None


class Exporter(Collector):
    """Reads the inputs on every scrape and keeps nothing between scrapes."""

    def __init__(self, *, engine_url: str, service: str, node: str, state_path: str = layout.PLAIN.watchdog_state,
                 current_link: str = layout.PLAIN.current_link, sentinel_path: str | None = None,
                 reserve_gib: float | None = None):
        self.engine_url, self.state_path = engine_url, state_path
        self.current_link, self.sentinel_path = current_link, sentinel_path
        self.identity = {"service": service, "node": node}
        self.reserve_gib = reserve_gib

    def collect(self):
        record = read_json(self.sentinel_path)
        try:
            if record is not None:
                sentinel.validate(record, self.sentinel_path)
        except InputError:
            record = None
        try:
            engine = metrics.scrape(self.engine_url, timeout=5)
        except BenchError:
            engine = None
        yield from families(identity=self.identity, state=read_json(self.state_path),
                            release=release_number(self.current_link), record=record, engine=engine,
                            memory=memory(reserve_gib=self.reserve_gib))


def serve(exporter: Exporter, host: str, port: int):
    """Serve `exporter` alone (no process metrics: this is about the engine, not the exporter) in a thread."""
    registry = CollectorRegistry()
    registry.register(exporter)
    return start_http_server(port, addr=host, registry=registry)


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value}: expected HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sparkdeploy.checks.exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_listen, default=("127.0.0.1", DEFAULT_PORT),
                        help=f"HOST:PORT to serve /metrics on [default 127.0.0.1:{DEFAULT_PORT}].")
    parser.add_argument("--engine", default="http://127.0.0.1:8000", help="The engine's base URL (its /metrics).")
    parser.add_argument("--state", default=layout.PLAIN.watchdog_state, help="The watchdog's state file.")
    parser.add_argument("--current", default=layout.PLAIN.current_link, help="The link to the release serving now.")
    parser.add_argument("--sentinel", help="The current release's sentinel record (JSON).")
    parser.add_argument("--service", default="default", help="The `service` label of every series [default].")
    parser.add_argument("--node", default=os.uname().nodename, help="The `node` label [this host's name].")
    parser.add_argument("--memory-reserve-gib", type=float, help="The plan's host reserve (memory.reserve_gib).")
    args = parser.parse_args(argv)
    server, thread = serve(Exporter(engine_url=args.engine, service=args.service, node=args.node,
                                    state_path=args.state, current_link=args.current, sentinel_path=args.sentinel,
                                    reserve_gib=args.memory_reserve_gib), *args.listen)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
