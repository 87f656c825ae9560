"""The one result vocabulary: doctor's checks, health's checks, the steps' per-node outcomes and the vocab
rollout's gates all say ok / changed / warn / failed (skipped where a check does not apply, "would change"
for a dry run), with a reason and, where the user can act, a fix. One vocabulary means one way to print,
count and serialise results, and `worst()` ranks any mix of them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable


class Status(str, enum.Enum):
    OK = "ok"
    CHANGED = "changed"
    WOULD_CHANGE = "would change"  # a dry run found something to do
    SKIPPED = "skipped"  # does not apply here (no such hardware, nothing deployed yet)
    WARN = "warn"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


_RANK = {Status.OK: 0, Status.SKIPPED: 0, Status.CHANGED: 1, Status.WOULD_CHANGE: 1, Status.WARN: 2,
         Status.FAILED: 3}


def worst(statuses: Iterable[Status]) -> Status:
    """The status that decides a run: failed > warn > changed > ok (ok when there is nothing)."""
    return max(statuses, key=_RANK.__getitem__, default=Status.OK)


@dataclass(frozen=True)
class Result:
    check: str
    node: str  # a node name, or "cluster" / "service" for results across nodes
    status: Status
    reason: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not Status.FAILED

    def to_dict(self) -> dict:
        return {"check": self.check, "node": self.node, "status": self.status.value, "reason": self.reason,
                "fix": self.fix}
