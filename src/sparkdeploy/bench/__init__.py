"""Measuring the running service the way the seeds learned to: medians of repeats after a warm-up, runs
started only on an idle engine and kept only when the counters prove nothing else ran, and A/B verdicts
against the noise measured by repeating, never against a fixed percentage.

Modules, one concern each:
  metrics  scrape /metrics, parse with prometheus_client, counter deltas with reset detection
  stats    medians, spread, noise estimates, verdicts
  client   the OpenAI-compatible HTTP calls (streamed, timestamped)
  run      one measured run: wait for idle, snapshot, send, watch, snapshot, keep or discard
  probe / harness / turn2   the three kinds of measurement
  results  the results JSON (schema, summaries, load/save)
  context  what the results record about the release (inventory now, the live release later)
  compare / report          verdicts between two results files; markdown + PNG plots
"""
