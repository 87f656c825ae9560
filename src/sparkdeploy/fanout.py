"""The one fan-out: a function over nodes (or services, or transfers) at once, on threads. Each call runs in a
copy of the caller's context, so an effects recording (connection.recording) or a dry-run session started
before the fan-out sees what every thread does."""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def parallel(items: Iterable[T], fn: Callable[[T], R], *, max_workers: int = 8) -> dict[int, R | Exception]:
    """`fn` over items at once; {index: result or the exception raised}. Never raises itself: the caller
    reports each failure against its node."""
    items = list(items)
    out: dict[int, R | Exception] = {}
    if not items:
        return out
    with cf.ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futs = {pool.submit(contextvars.copy_context().run, fn, it): i for i, it in enumerate(items)}
        for fut in cf.as_completed(futs):
            try:
                out[futs[fut]] = fut.result()
            except Exception as err:  # noqa: BLE001 - reported per item by the caller
                out[futs[fut]] = err
    return out


def each(items: Iterable[T], fn: Callable[[T], R], *, max_workers: int = 8) -> list[R]:
    """`fn` over items at once; their results in the items' order, or the first failure (in that order) raised
    once every call has ended."""
    items = list(items)
    res = parallel(items, fn, max_workers=max_workers)
    for i in range(len(items)):
        if isinstance(res[i], Exception):
            raise res[i]
    return [res[i] for i in range(len(items))]
