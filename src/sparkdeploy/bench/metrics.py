"""vLLM's /metrics as data: snapshots parsed with prometheus_client, and counter deltas between two snapshots.

A delta is only trusted if no counter went backwards and no counter's `_created` time (or the process start
time) changed: either means the server restarted between the snapshots, and the run must be discarded, not
averaged in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import requests
from prometheus_client.parser import text_string_to_metric_families

from sparkdeploy.errors import BenchError

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SUCCESS = "vllm:request_success_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
TTFT_SUM, TTFT_COUNT = "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"
DECODE_TIME_SUM = "vllm:request_decode_time_seconds_sum"
DECODE_TIME_COUNT = "vllm:request_decode_time_seconds_count"
PROCESS_START = "process_start_time_seconds"

Labels = frozenset  # frozenset of (name, value) pairs


class CounterReset(BenchError):
    """A counter went backwards or was re-created between two snapshots: the server restarted."""


@dataclass(frozen=True)
class Snapshot:
    """Every sample of one /metrics scrape: counters (sample names ending `_total`), gauges, `_created` times."""

    samples: dict[tuple[str, Labels], float]
    counters: frozenset[str] = field(default_factory=frozenset)  # sample names of counter families

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples called `name` whose labels include `labels` (so engines and reasons add up)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def label_values(self, name: str, label: str) -> list[str]:
        """Distinct values of one label on the samples called `name` (e.g. spec-decode `position`)."""
        found = {dict(ls)[label] for n, ls in self.samples if n == name and label in dict(ls)}
        return sorted(found, key=lambda v: (len(v), v))


def parse(text: str) -> Snapshot:
    """Parse Prometheus text exposition (what vLLM serves) into a Snapshot."""
    samples: dict[tuple[str, Labels], float] = {}
    counters: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                samples[key] = float(sample.value)
                if family.type == "counter" and sample.name.endswith("_total"):
                    counters.add(sample.name)
    except ValueError as err:
        raise BenchError(f"/metrics: not Prometheus text format: {err}") from err
    return Snapshot(samples, frozenset(counters))


def scrape(base_url: str, *, timeout: float = 10.0, session: requests.Session | None = None) -> Snapshot:
    """GET <base>/metrics and parse it."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = (session or requests).get(url, timeout=timeout)
        resp.raise_for_status()
    except requests.RequestException as err:
        raise BenchError(f"{url}: cannot read metrics: {err}") from err
    return parse(resp.text)


@dataclass(frozen=True)
class Delta:
    """Counter increases between two snapshots of the same server process."""

    before: Snapshot
    after: Snapshot

    def __post_init__(self) -> None:
        problem = reset_reason(self.before, self.after)
        if problem:
            raise CounterReset(problem)

    def __call__(self, name: str, **labels: str) -> float:
        return self.after.value(name, **labels) - self.before.value(name, **labels)

    def spec_decode(self) -> dict | None:
        """Acceptance figures from the spec-decode counters, or None when no speculation ran."""
        drafts = self(DRAFTS)
        if not self.after.has(DRAFTS) or drafts <= 0:
            return None
        accepted = self(ACCEPTED)
        draft_tokens = self(DRAFT_TOKENS)
        positions = self.after.label_values(ACCEPTED_PER_POS, "position")
        return {
            "drafts": drafts,
            "draft_tokens": draft_tokens,
            "accepted_tokens": accepted,
            # mean acceptance length: tokens emitted per verify step that carried a draft
            "acceptance_length": 1.0 + accepted / drafts,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "per_position": [self(ACCEPTED_PER_POS, position=p) / drafts for p in positions],
        }

    def server_timing(self) -> dict:
        """The engine's own view of the run's requests (immune to a starved client): mean TTFT, decode tok/s."""
        out: dict = {}
        n_ttft, n_dec = self(TTFT_COUNT), self(DECODE_TIME_COUNT)
        if n_ttft > 0:
            out["ttft_s"] = self(TTFT_SUM) / n_ttft
        decode_s = self(DECODE_TIME_SUM)
        if n_dec > 0 and decode_s > 0:
            # decode time runs from a request's first token to its last: the first token is the prefill's
            out["decode_tok_s"] = (self(GENERATION_TOKENS) - n_dec) / decode_s
        return out

    def prefix_cache(self) -> dict:
        queries, hits = self(PREFIX_QUERIES), self(PREFIX_HITS)
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else None}


def reset_reason(before: Snapshot, after: Snapshot) -> str | None:
    """Why `after` is not a continuation of `before` (a restart), or None if it is."""
    b_start, a_start = before.value(PROCESS_START), after.value(PROCESS_START)
    if before.has(PROCESS_START) and after.has(PROCESS_START) and a_start != b_start:
        return f"{PROCESS_START} changed {b_start:.0f} -> {a_start:.0f}: the server restarted"
    for key, old in before.samples.items():
        name, labels = key
        if name not in before.counters and not name.endswith("_created"):
            continue
        new = after.samples.get(key)
        shown = name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels)) + "}" if labels else "")
        if new is None:
            if name in before.counters:
                return f"counter {shown} disappeared: the server restarted"
            continue
        if name.endswith("_created") and new != old:
            return f"{shown} changed {old} -> {new}: the counter was re-created (server restart)"
        if name in before.counters and new < old:
            return f"counter {shown} went backwards {old:g} -> {new:g}: the server restarted"
    return None
