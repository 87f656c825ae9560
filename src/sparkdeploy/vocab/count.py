"""Counting: stream chunks through a tokenizer on all cores and accumulate id counts with numpy.

Memory stays flat: a fixed window of chunks is in flight, encoded ids are folded into one int64 count
vector per ~2M tokens with `np.bincount(concatenate(...), minlength=V)` (never per document: the V-long add
would dominate), and nothing else is kept. Counting costs about 1% of tokenizing.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from sparkdeploy.vocab.tokenizer import HFTokenizer, Tokenizer, TiktokenTokenizer

FOLD_TOKENS = 2_000_000


@dataclass
class Counts:
    """Token counts of one corpus: `counts[id]`, total `tokens`, and how many chunks were encoded."""

    counts: np.ndarray
    tokens: int
    chunks: int


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


def count_ids(tokenizer: Tokenizer, chunks: Iterable[str], *, threads: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> Counts:
    """Encode every chunk and count ids. `progress(chunks_done, tokens_done)` is called per fold.

    tiktoken releases the GIL while encoding, so chunks are spread over a thread pool one by one; HF
    `tokenizers` parallelises a batch itself, so it gets groups of chunks, two groups in flight.
    """
    vocab = tokenizer.vocab_size
    acc = np.zeros(vocab, dtype=np.int64)
    pending: list[np.ndarray] = []
    pending_tokens = 0
    tokens = 0
    done = 0
    workers = threads or _workers()

    if isinstance(tokenizer, TiktokenTokenizer):
        unit_chunks, window, encode = 1, 4 * workers, lambda unit: tokenizer._one(unit[0])
        pool_size = workers
    else:
        unit_chunks, window, encode = 16, 2, tokenizer.encode_concat
        pool_size = 1 if isinstance(tokenizer, HFTokenizer) else workers

    def fold() -> None:
        nonlocal pending, pending_tokens
        if pending:
            ids = np.concatenate(pending) if len(pending) > 1 else pending[0]
            acc[:] += np.bincount(ids, minlength=vocab)[:vocab]
            pending, pending_tokens = [], 0
            if progress:
                progress(done, tokens)

    def take(item: tuple[Future, int]) -> None:
        nonlocal pending_tokens, tokens, done
        ids = item[0].result()
        pending.append(ids)
        pending_tokens += len(ids)
        tokens += len(ids)
        done += item[1]
        if pending_tokens >= FOLD_TOKENS:
            fold()

    inflight: deque[tuple[Future, int]] = deque()
    with ThreadPoolExecutor(pool_size, thread_name_prefix="vocab-count") as pool:
        unit: list[str] = []
        for chunk in chunks:
            unit.append(chunk)
            if len(unit) < unit_chunks:
                continue
            inflight.append((pool.submit(encode, unit), len(unit)))
            unit = []
            while len(inflight) >= window:
                take(inflight.popleft())
        if unit:
            inflight.append((pool.submit(encode, unit), len(unit)))
        while inflight:
            take(inflight.popleft())
    fold()
    return Counts(acc, tokens, done)
