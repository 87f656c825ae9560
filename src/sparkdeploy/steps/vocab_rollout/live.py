"""The live path of `vocab rollout`: which path a rollout takes, and the swap with its checks and swap-back.

A draft list cannot change an output token, so where the running engine can take a new list (its release
starts the shortlist head with `live_check_every`, and the list fits the head's capacity) the rollout swaps it
in place (vocab_live.live_swap) instead of restarting both ranks. The checks after the swap are the restart
rollout's (golden outputs byte-identical, acceptance per category) plus one of its own: every rank reports it
serves the new sha256. A failed check swaps the old list back live. After a good swap, `current` moves to the
release the rollout wrote (the running one with only the list's sha256 changed), so a later restart of the
engine finds `current.txt` matching the sha256 its release names (overlays/README.md "Live list swap").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from sparkdeploy.node.layout import NODE_PLAN_FILE, ServiceLayout
from sparkdeploy.ops import releases, vocab_live
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps.vocab_rollout.checks import RolloutError

LIVE, RESTART = "live", "restart"

ACCEPTANCE_NOISE = 0.05
"""Relative drop of the mean acceptance length (over the golden categories) that fails a live swap. The same
greedy prompts on the same engine draft the same tokens, so what moves the figure beyond batch-dependent
kernel rounding is the list."""


def shortlist_settings(node_plan: bytes | None) -> dict:
    """`spark_overlays.shortlist` of the `--additional-config` in a release's node-plan.json (what the running
    engine was started with); {} when the release has none."""
    if not node_plan:
        return {}
    try:
        argv = json.loads(node_plan)["node"]["serve_argv"]
        cfg = json.loads(argv[argv.index("--additional-config") + 1])
    except (ValueError, KeyError, IndexError, TypeError):
        return {}
    return cfg.get("spark_overlays", {}).get("shortlist", {}) or {}


def read_settings(conn: Conn, lay: ServiceLayout, release: int) -> dict:
    return shortlist_settings(conn.get(f"{releases.rdir(lay, release)}/{NODE_PLAN_FILE}"))


def choose_path(settings: dict, size: int, live_size: int | None, *, restart: bool, release: int) -> tuple[str, str]:
    """(LIVE or RESTART, why). The head's capacity is fixed at start: the release's `capacity`, else the size
    of the list it started with, which is at least the live list's (`live_size`: the bound taken).

    RolloutError when the release sets a `capacity` below the list's size: a restart of a release derived from
    it starts the same head, whose overlay then refuses the list and drafts without the shortlist."""
    fixed = settings.get("capacity")
    if fixed and size > fixed:
        raise RolloutError(f"the list's {size:,} ids exceed the draft head capacity of release {release} "
                           f"({fixed:,} rows, the profile's shortlist.capacity), and neither a live swap nor a "
                           f"restart of that release can hold it: raise shortlist.capacity to at least {size:,}, "
                           "point the inventory's `vocab:` at this list and run `sparkdeploy up`")
    if restart:
        return RESTART, "--restart asked for a restart rollout"
    if not settings.get("live_check_every"):
        return RESTART, (f"release {release} starts the engine without a live list swap (no "
                         "shortlist.live_check_every in the profile, or the pin's shortlist overlay has none: "
                         "`sparkdeploy plan` says which); restarting the engine instead")
    capacity = settings.get("capacity") or live_size
    if capacity is None:
        return RESTART, f"the capacity of release {release}'s draft head is unknown (live list unreadable)"
    if size > capacity:
        return RESTART, (f"the list's {size:,} ids exceed the running draft head's {capacity:,} rows (the list it "
                         "started with); a restart starts a head sized for the new one")
    return LIVE, (f"release {release} takes a new list in the running engine (capacity {capacity:,} rows, "
                  f"list {size:,} ids)")


def acceptance_drop(before: dict, after: dict, noise: float = ACCEPTANCE_NOISE) -> str | None:
    """Why the acceptance after the swap is worse beyond noise (None when it is not, or when a category has
    no figure on both sides: nothing to compare)."""
    cats = sorted(c for c in set(before) & set(after) if before[c] and after[c])
    if not cats:
        return None
    mean = lambda figs: sum(figs[c]["acceptance_length"] for c in cats) / len(cats)  # noqa: E731
    b, a = mean(before), mean(after)
    if a >= b * (1 - noise):
        return None
    return (f"mean acceptance length fell {b:.3f} -> {a:.3f} ({(b - a) / b:.1%}, noise {noise:.0%}) over "
            + ", ".join(f"{c} {before[c]['acceptance_length']:.3f}->{after[c]['acceptance_length']:.3f}" for c in cats))


def served_problems(conns: Sequence[Conn], lay: ServiceLayout, sha: str,
                    logs: Callable[[Conn, ServiceLayout], str] = vocab_live.engine_reports) -> list[str]:
    """Every rank whose last report is not `sha`, named with what it serves."""
    out = []
    for conn in conns:
        ranks = vocab_live.served(conn, lay, logs)
        if not ranks:
            out.append(f"{conn.name}: the engine reports no draft list")
        out += [f"{conn.name} rank {r}: serves {vocab_live.version_of(s.sha256)}" for r, s in sorted(ranks.items())
                if s.sha256 != sha]
    return out


@dataclass
class SwapOutcome:
    ok: bool
    reason: str = ""  # why the new list is not live (refused, or a check after the swap failed)
    swapped_back: bool | None = None  # None: nothing to swap back (the swap itself was refused)


def swap_and_check(conns: Sequence[Conn], lay: ServiceLayout, sha: str, old_sha: str, *,
                   verify: Callable[[], str | None], nudge: Callable[[], None] = lambda: None,
                   logs: Callable[[Conn, ServiceLayout], str] = vocab_live.engine_reports,
                   timeout: float = 120) -> SwapOutcome:
    """Swap every rank to `sha`, check every rank serves it and `verify()` (golden + acceptance: why it
    failed, or None); on a failed check swap `old_sha` back live. A refused swap left every pointer on the
    old list already (live_swap)."""
    result = vocab_live.live_swap(conns, lay, sha, timeout=timeout, nudge=nudge, logs=logs)
    if not result.ok:
        return SwapOutcome(False, "live swap refused: " + "; ".join(result.problems()))
    reason = "; ".join(served_problems(conns, lay, sha, logs)) or verify()
    if not reason:
        return SwapOutcome(True)
    back = vocab_live.live_swap(conns, lay, old_sha, timeout=timeout, nudge=nudge, logs=logs)
    return SwapOutcome(False, reason, back.ok and not served_problems(conns, lay, old_sha, logs))


def make_current(conns: Sequence[Conn], lay: ServiceLayout, number: int) -> None:
    """Point `current` at release `number` (the running one with the new list's sha256) on every node, without
    a restart: the engine already serves its list, and a later restart starts it with that list."""
    for conn in conns:
        releases.switch(conn, lay, number)
