"""One measured run: wait until the engine is idle, snapshot the counters, send the requests, watch the
running-requests gauge while they run, snapshot again, and keep the run only if the counters prove that
exactly our requests ran.

A run is discarded (with the reason recorded) when:
  - the server restarted between the snapshots (a counter went backwards or was re-created);
  - `vllm:request_success_total` did not rise by exactly the number of requests sent;
  - the running-requests gauge, sampled during the run, exceeded the requests we had in flight;
  - a request was still running or waiting when the run ended;
  - one of our requests failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from sparkdeploy import poll as polling
from sparkdeploy.bench import metrics
from sparkdeploy.bench.client import RequestResult, Service
from sparkdeploy.errors import BenchError


@dataclass
class RunOutcome:
    kept: bool
    discard_reason: str | None
    requests: list[RequestResult]
    delta: metrics.Delta | None
    peak_running: float | None
    wall_s: float
    extra: dict = field(default_factory=dict)


def wait_idle(service: Service, *, timeout: float = 120.0, poll: float = 0.2,
              session: requests.Session | None = None) -> metrics.Snapshot:
    """Return a snapshot taken while nothing runs or waits; raise if the engine stays busy."""
    def attempt() -> metrics.Snapshot:
        snap = metrics.scrape(service.url, session=session)
        running, waiting = snap.value(metrics.RUNNING), snap.value(metrics.WAITING)
        if running or waiting:
            raise polling.NotYet(f"running {running:g}, waiting {waiting:g}")
        return snap

    try:
        return polling.until(attempt, timeout=timeout, interval=poll)
    except polling.TimedOut as out:
        raise BenchError(f"{service.url}: engine still busy after {timeout:.0f} s ({out.last}); not starting a "
                         "run") from None


class _Watcher(threading.Thread):
    """Samples the running+waiting gauges while a run is in flight; records the peak and how many of our
    requests were in flight at that moment."""

    def __init__(self, service: Service, in_flight: Callable[[], int], interval: float):
        super().__init__(daemon=True)
        self.service, self.in_flight, self.interval = service, in_flight, interval
        self.peak = 0.0
        self.samples = 0
        self.excess: str | None = None
        self._stop_event = threading.Event()
        self._session = requests.Session()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                ours_before = self.in_flight()
                snap = metrics.scrape(self.service.url, session=self._session, timeout=5)
                ours_after = self.in_flight()
            except BenchError:
                self._stop_event.wait(self.interval)
                continue
            self.samples += 1
            seen = snap.value(metrics.RUNNING) + snap.value(metrics.WAITING)
            self.peak = max(self.peak, snap.value(metrics.RUNNING))
            if seen > max(ours_before, ours_after) and self.excess is None:
                self.excess = (f"{seen:g} requests running or waiting while only "
                               f"{max(ours_before, ours_after)} of ours were in flight")
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
        self._session.close()


def measured_run(service: Service, send: list[Callable[[], RequestResult | list[RequestResult]]], *,
                 idle_timeout: float = 120.0,
                 settle_s: float = 3.0, watch_interval: float | None = None,
                 on_start: Callable[[], None] | None = None) -> RunOutcome:
    """Run the thunks in `send` concurrently (one thread each) as one measured run.

    A thunk is one stream: it sends one request, or several one after another, and returns what it saw.

    `on_start` is called right after the requests are launched (tests use it to inject a stray request).
    `watch_interval` (seconds) samples the running-requests gauge during the run for the peak check; scraping
    /metrics costs the API server CPU, so single-stream runs leave it off: the success counter and the idle
    checks at both ends already catch a stray request.
    """
    session = requests.Session()
    try:
        before = wait_idle(service, timeout=idle_timeout, session=session)
        lock = threading.Lock()
        in_flight = [len(send)]  # ours, from launch until each stream has ended

        def call(fn: Callable[[], RequestResult | list[RequestResult]]) -> list[RequestResult]:
            try:
                got = fn()
                return got if isinstance(got, list) else [got]
            except Exception as err:  # noqa: BLE001 - a failed request discards the run, it does not stop the bench
                return [RequestResult(ok=False, error=f"{type(err).__name__}: {err}")]
            finally:
                with lock:
                    in_flight[0] -= 1

        watcher = _Watcher(service, lambda: in_flight[0], watch_interval) if watch_interval else None
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, len(send))) as pool:
            futures = [pool.submit(call, fn) for fn in send]
            if watcher:
                watcher.start()
            if on_start:
                on_start()
            results = [r for f in futures for r in f.result()]
        wall = time.perf_counter() - t0
        if watcher:
            watcher.stop()
        outcome = _judge(service, before, results, wall, watcher, settle_s, session)
        outcome.extra["streams"] = len(send)
        if watcher:
            outcome.extra["watch_samples"] = watcher.samples
        return outcome
    finally:
        session.close()


def _judge(service: Service, before: metrics.Snapshot, results: list[RequestResult], wall: float,
           watcher: _Watcher | None, settle_s: float, session: requests.Session) -> RunOutcome:
    sent = len(results)
    peak = watcher.peak if watcher else None

    def outcome(reason: str | None, delta: metrics.Delta | None) -> RunOutcome:
        return RunOutcome(reason is None, reason, results, delta, peak, wall)

    failed = [r for r in results if not r.ok]
    if failed:
        return outcome(f"{len(failed)} of {sent} requests failed: {failed[0].error}", None)
    # the success counter is recorded just after the last chunk is sent: allow it a moment to land
    deadline = time.monotonic() + settle_s
    while True:
        after = metrics.scrape(service.url, session=session)
        try:
            delta = metrics.Delta(before, after)
        except metrics.CounterReset as err:
            return outcome(f"counter reset: {err}", None)
        done = delta(metrics.SUCCESS)
        if done >= sent or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if done != sent:
        return outcome(f"vllm:request_success_total rose by {done:g}, expected {sent}: "
                       "another request ran during the run", delta)
    if watcher and watcher.excess:
        return outcome(f"stray request: {watcher.excess}", delta)
    # the gauges may trail the counters by an engine step: a request still there after the settle time
    # (or one that finishes meanwhile and moves the success counter) was not ours
    while True:
        busy = after.value(metrics.RUNNING) + after.value(metrics.WAITING)
        if not busy:
            return outcome(None, delta)
        if time.monotonic() > deadline:
            return outcome(f"{busy:g} requests still running or waiting at the end of the run", delta)
        time.sleep(0.05)
        after = metrics.scrape(service.url, session=session)
        try:
            if metrics.Delta(before, after)(metrics.SUCCESS) != sent:
                return outcome("vllm:request_success_total moved after the run ended: another request ran "
                               "during the run", delta)
        except metrics.CounterReset as err:
            return outcome(f"counter reset: {err}", None)
