"""Prometheus metrics people can graph, served from the head: the watchdog's verdicts, restarts and give-ups
(its state file, read only: the watchdog stays stdlib-only and knows nothing of Prometheus), the release
serving now, the sentinel's figures per category, and live acceptance length from the engine's counters.

`families()` turns what was read into metric families and does nothing else, so every figure is testable
from a dict; `Exporter` reads its inputs on each scrape (an input it cannot read shows as
`sparkdeploy_exporter_source_up{source=...} 0`, not as an error page); `python -m sparkdeploy.exporter`
serves it. Live acceptance is 1 + accepted/drafts over the counter deltas between two scrapes, so a
Prometheus scraping every 15 s graphs the acceptance of the last 15 s of traffic; a window without drafts
(no traffic) or across an engine restart has no value rather than a made-up one.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sparkdeploy import layout
from sparkdeploy.bench import metrics, sentinel, stats
from sparkdeploy.errors import BenchError, InputError

DEFAULT_PORT = 9466
ACTIONS = ("none", "wait", "restart", "give_up")  # the watchdog's decide() outcomes
SOURCES = ("watchdog_state", "release", "sentinel", "engine")


def families(*, state: dict | None, release: int | None, record: dict | None,
             live: dict | None, engine_up: bool) -> list[GaugeMetricFamily]:
    """All metric families from what was read (None: that input could not be read)."""
    out = [_gauge("sparkdeploy_exporter_source_up", "1 when the exporter could read this input on this scrape.",
                  [(("source",), (s,), float(ok)) for s, ok in zip(
                      SOURCES, (state is not None, release is not None, record is not None, engine_up))])]
    if release is not None:
        out.append(_gauge("sparkdeploy_release_number", "The release `current` points at on the head.",
                          [((), (), release)]))
    if state is not None:
        out += _watchdog(state)
    if record is not None:
        out += _sentinel(record)
    if live is not None:
        out += _live(live)
    return out


def _watchdog(state: dict) -> list[GaugeMetricFamily]:
    last = state.get("last_action")
    fams = [
        _gauge("sparkdeploy_watchdog_verdict", "1 for the action the watchdog's last tick decided, 0 for the others.",
               [(("action",), (a,), float(a == last)) for a in ACTIONS]),
        _gauge("sparkdeploy_watchdog_failures", "Consecutive failed ticks (the watchdog acts at its threshold).",
               [((), (), float(state.get("failures", 0)))]),
        _gauge("sparkdeploy_watchdog_restarts", "Coupled restarts in the current unstable period (the watchdog "
               "forgets them once the engine stayed healthy long enough).",
               [((), (), float(len(state.get("restarts", []))))]),
        _gauge("sparkdeploy_watchdog_gave_up", "1 when the watchdog gave up after its retry cap and stopped the "
               "service.", [((), (), float(bool(state.get("gave_up"))))]),
    ]
    times = {"last_tick": "its last tick", "last_ok": "the engine last answered a completion",
             "last_restart": "its last coupled restart", "gave_up_at": "it gave up"}
    for key, what in times.items():
        if isinstance(state.get(key), (int, float)):
            name = "sparkdeploy_watchdog_gave_up_timestamp_seconds" if key == "gave_up_at" else \
                f"sparkdeploy_watchdog_{key}_timestamp_seconds"
            fams.append(_gauge(name, f"When {what} (Unix time).", [((), (), float(state[key]))]))
    return fams


def _sentinel(record: dict) -> list[GaugeMetricFamily]:
    """Medians of each category's repeats, as the sentinel compares them."""
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
    return fams


def _live(spec: dict) -> list[GaugeMetricFamily]:
    fams = [_gauge("sparkdeploy_live_drafts", "Verify steps that carried a draft between the last two scrapes.",
                   [((), (), spec["drafts"])])]
    if spec["drafts"] > 0:
        fams += [
            _gauge("sparkdeploy_live_acceptance_length", "Mean acceptance length of live traffic between the last "
                   "two scrapes: 1 + accepted / drafts.", [((), (), spec["acceptance_length"])]),
            _gauge("sparkdeploy_live_accept_position", "Share of live drafts accepted at this position between "
                   "the last two scrapes.",
                   [(("position",), (str(i),), r) for i, r in enumerate(spec["per_position"])]),
        ]
    return fams


def live_figures(before: metrics.Snapshot, after: metrics.Snapshot) -> dict | None:
    """Spec-decode counter deltas between two engine scrapes; None across a restart or without spec decode."""
    if not after.has(metrics.DRAFTS):
        return None
    try:
        delta = metrics.Delta(before, after)
    except metrics.CounterReset:
        return None
    return delta.spec_decode() or {"drafts": 0.0}


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


class Exporter(Collector):
    """Reads the inputs on every scrape; keeps the engine's previous snapshot for the live deltas."""

    def __init__(self, *, engine_url: str, state_path: str = layout.PLAIN.watchdog_state,
                 current_link: str = layout.PLAIN.current_link, sentinel_path: str | None = None):
        self.engine_url, self.state_path = engine_url, state_path
        self.current_link, self.sentinel_path = current_link, sentinel_path
        self._previous: metrics.Snapshot | None = None
        self._lock = threading.Lock()

    def collect(self):
        record = read_json(self.sentinel_path)
        try:
            if record is not None:
                sentinel.validate(record, self.sentinel_path)
        except InputError:
            record = None
        with self._lock:
            try:
                now = metrics.scrape(self.engine_url, timeout=5)
            except BenchError:
                now = None
            live = live_figures(self._previous, now) if self._previous and now else None
            self._previous = now
        yield from families(state=read_json(self.state_path), release=release_number(self.current_link),
                            record=record, live=live, engine_up=now is not None)


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
    parser = argparse.ArgumentParser(prog="python -m sparkdeploy.exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_listen, default=("127.0.0.1", DEFAULT_PORT),
                        help=f"HOST:PORT to serve /metrics on [default 127.0.0.1:{DEFAULT_PORT}].")
    parser.add_argument("--engine", default="http://127.0.0.1:8000", help="The engine's base URL (its /metrics).")
    parser.add_argument("--state", default=layout.PLAIN.watchdog_state, help="The watchdog's state file.")
    parser.add_argument("--current", default=layout.PLAIN.current_link, help="The link to the release serving now.")
    parser.add_argument("--sentinel", help="The current release's sentinel record (JSON).")
    args = parser.parse_args(argv)
    server, thread = serve(Exporter(engine_url=args.engine, state_path=args.state, current_link=args.current,
                                    sentinel_path=args.sentinel), *args.listen)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
