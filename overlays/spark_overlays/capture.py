"""Patch 3: count the token ids the engine emits, for ``sparkdeploy vocab learn`` (switch:
``spark_overlays.capture.enabled``; off unless set).

**Hook: the engine core's scheduler**, through vLLM's own ``--scheduler-cls`` extension point, set to
``spark_overlays.capture.scheduler``. ``Scheduler.update_from_output`` returns, per request, the
``EngineCoreOutput.new_token_ids`` streamed to the client: after rejection sampling, cut at a stop, with or
without speculative decoding, once per engine (not once per TP rank), on 0.32 and 0.33 alike (the V1 and the
V2 model runners both report to it). The two hooks the issue names fall short:

* a V1 logits processor: ``build_logitsprocs`` refuses custom logits processors, and does not even load the
  ``vllm.logits_processors`` plugins, whenever speculative decoding is configured (0.32 and 0.33). Every
  production profile drafts with MTP, so the capture would be absent exactly where it is needed. It would
  also run in each TP worker and see ids before the engine cuts them at a stop.
* the draft head: exists only with the shortlist on, runs on every TP rank, and conditions on the prompt
  (prefill) and on its own drafts as well as on the emitted ids.

``scheduler(...)`` builds the scheduler vLLM would have built (``AsyncScheduler`` when async scheduling is
on, else ``Scheduler``; vLLM's warning that a custom class loses async scheduling does not apply): with the
switch off it *is* that stock class, so an off switch costs nothing. With it on, a subclass counts each
step's new ids with one ``np.add.at`` into a vocab-sized int64 array.

**The run-time switch** (``switch``: a file path; the kit renders the block on every release and
``sparkdeploy vocab capture on|off`` creates or removes that file). With a switch the scheduler class is the
capturing one, but it counts only while the file exists: the flush thread looks for it every
``SWITCH_POLL_S`` (or ``flush_seconds`` if shorter). Turning it off flushes what was counted while it was on
and then counts nothing, so capture never on leaves no counts file. No engine restart either way, which on a
two-box TP=2 deployment saves minutes of restart per toggle. Off, a step costs one attribute check.

What is kept: that array, a count per id. No text, no prompt ids, nothing naming a request. The counts file
(``.npy``, 1-D int64, one entry per id of the model's vocabulary) accumulates across restarts: each flush adds
the counts since the last flush to what the file holds and replaces it atomically (temp file, fsync, rename),
so deleting the file clears the capture even while the engine runs. Flushes happen every ``flush_seconds``
(a daemon thread: an idle engine runs no step), as soon as ``flush_tokens`` are pending, and at engine
shutdown. The last one is best effort: on SIGTERM the API server stops the engine core at once (vLLM's
default ``--shutdown-timeout 0`` aborts, and its process manager kills what is left), so a stop can lose up
to ``flush_seconds`` of counts. A file that is not a counts file of this vocabulary is never overwritten:
capture stops with the reason logged, serving goes on. With data parallelism each engine core writes
``<stem>.dp<index>.npy`` beside ``path``.

Nothing here imports vLLM or torch at module load (the factory imports the scheduler classes when called).
"""

from __future__ import annotations

import atexit
import io
import itertools
import os
import threading
import time
from pathlib import Path

import numpy as np

from . import settings as _settings
from ._util import atomic_write_bytes, fail_closed, info, process_tag

FEATURE = "capture"
DTYPE = np.int64
SWITCH_POLL_S = 1.0
MAX_COUNTS_BYTES = 64 << 20  # 2^23 ids of int64 + header; real vocabularies are ~150k ids (1.2 MB)


class CountsError(ValueError):
    """A file that is not a counts file (for this vocabulary); the message names the file."""


def read_counts(path: str | os.PathLike, vocab_size: int | None = None) -> np.ndarray:
    """The counts in ``path``: a 1-D non-negative int64 array (of ``vocab_size`` entries when given).
    The one reader of counts files, for the engine (accumulating) and ``vocab learn``."""
    p = Path(path)
    try:
        if not p.is_file():
            raise CountsError(f"{p}: " + ("not a regular file" if p.exists() else "no such counts file"))
        if p.stat().st_size > MAX_COUNTS_BYTES:
            raise CountsError(f"{p}: larger than {MAX_COUNTS_BYTES >> 20} MiB; not a counts file")
        arr = np.load(p, allow_pickle=False)
    except OSError as e:
        raise CountsError(f"{p}: cannot read ({e.strerror or e})") from None
    except ValueError as e:  # not .npy, or an object array (pickle refused)
        raise CountsError(f"{p}: not a counts file (.npy of integer counts): {e}") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != DTYPE:
        raise CountsError(f"{p}: not a counts file: expected a 1-D int64 array, got "
                          f"{getattr(arr, 'dtype', type(arr).__name__)} of shape {getattr(arr, 'shape', '?')}")
    if vocab_size is not None and arr.shape[0] != vocab_size:
        raise CountsError(f"{p}: holds counts for {arr.shape[0]} ids, this model's vocabulary has {vocab_size}")
    if arr.size and int(arr.min()) < 0:
        raise CountsError(f"{p}: negative counts (id {int(np.argmin(arr))})")
    return arr


def write_counts(path: str | os.PathLike, counts: np.ndarray) -> None:
    """Replace ``path`` with ``counts`` atomically (`_util.atomic_write_bytes`)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(counts, dtype=DTYPE), allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())


def counts_path(path: str, dp_rank: int = 0, dp_size: int = 1) -> Path:
    """Where one engine core writes: ``path``, or ``<stem>.dp<index><suffix>`` beside it under data parallelism."""
    p = Path(path)
    return p if dp_size <= 1 else p.with_name(f"{p.stem}.dp{dp_rank}{p.suffix or '.npy'}")


class TokenCounts:
    """Counts of emitted ids since the last flush, and the flushes. Pure numpy (tested without vLLM).

    ``add`` runs on the engine core's busy loop and flushes inline when ``flush_tokens`` are pending; a daemon
    thread (``start``) flushes every ``flush_seconds``, since an idle engine calls nothing. A flush takes the
    pending counts under a lock and writes outside it: a step waits for the disk only on its own token flush."""

    def __init__(self, path: str | os.PathLike, vocab_size: int, flush_seconds: float, flush_tokens: int,
                 switch: str | os.PathLike | None = None):
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.flush_seconds = flush_seconds
        self.flush_tokens = flush_tokens
        self.switch = Path(switch) if switch else None
        self.counts = np.zeros(vocab_size, dtype=DTYPE)
        self.pending = 0
        self.active = True  # False once a flush or a count failed (fail closed until restart)
        self.on = self._switched_on()
        self._lock = threading.Lock()  # the counts and pending (step vs flush)
        self._write_lock = threading.Lock()  # one read-add-replace of the file at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.path.exists():
            read_counts(self.path, vocab_size)  # refuse a foreign file at start, not at the first flush
        elif not self.path.parent.is_dir():
            raise CountsError(f"{self.path}: directory {self.path.parent} does not exist")

    @property
    def counting(self) -> bool:
        return self.active and self.on

    def _switched_on(self) -> bool:
        return self.switch is None or self.switch.exists()

    def add(self, ids: np.ndarray) -> None:
        """Count one step's new ids (out-of-range ids, e.g. placeholders, are not counted)."""
        if not self.counting or not ids.size:
            return
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            ids = ids[(ids >= 0) & (ids < self.vocab_size)]
        with self._lock:
            np.add.at(self.counts, ids, 1)
            self.pending += int(ids.size)
        if self.pending >= self.flush_tokens:
            self.flush()

    def flush(self) -> None:
        """Add the pending counts to the file (a missing file starts from zero) and replace it atomically.
        The step's lock is held only to take the pending counts, not while writing."""
        with self._write_lock:
            with self._lock:
                if not self.active or not self.pending:
                    return
                delta, self.counts, self.pending = self.counts, np.zeros_like(self.counts), 0
            try:
                base = read_counts(self.path, self.vocab_size) if self.path.exists() else 0
                write_counts(self.path, base + delta)
            except (CountsError, OSError) as e:
                self.active = False
                fail_closed(FEATURE, f"counts not written, capture stopped: {e}")

    def start(self) -> None:
        """Flush every ``flush_seconds`` (and follow the switch) on a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._every, name="spark-capture-flush", daemon=True)
        self._thread.start()

    def _every(self) -> None:
        period = self.flush_seconds if self.switch is None else min(self.flush_seconds, SWITCH_POLL_S)
        due = time.monotonic() + self.flush_seconds
        while not self._stop.wait(period):
            was, self.on = self.on, self._switched_on()
            if (was and not self.on) or time.monotonic() >= due:  # switched off: keep what was counted while on
                self.flush()
                due = time.monotonic() + self.flush_seconds

    def stop(self) -> None:
        """The last flush (engine shutdown, interpreter exit)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()


_CLASSES: dict[type, type] = {}


def _capturing(base: type) -> type:
    """``base`` with counting added after ``update_from_output`` and a flush at ``shutdown`` (one per base)."""
    if base in _CLASSES:
        return _CLASSES[base]

    class CapturingScheduler(base):  # type: ignore[misc, valid-type]
        _spark_counts: TokenCounts

        def update_from_output(self, scheduler_output, model_runner_output):
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            if not self._spark_counts.counting:
                return outputs
            try:
                ids = np.fromiter(itertools.chain.from_iterable(
                    o.new_token_ids for eco in outputs.values() for o in eco.outputs), dtype=DTYPE)
                self._spark_counts.add(ids)
            except Exception as e:  # noqa: BLE001 - counting must never stop serving
                self._spark_counts.active = False
                fail_closed(FEATURE, f"counting failed, capture stopped: {type(e).__name__}: {e}")
            return outputs

        def shutdown(self) -> None:
            try:
                self._spark_counts.stop()
            finally:
                super().shutdown()

    CapturingScheduler.__name__ = CapturingScheduler.__qualname__ = f"Capturing{base.__name__}"
    _CLASSES[base] = CapturingScheduler
    return CapturingScheduler


def _stock_class(vllm_config) -> type:
    """What ``SchedulerConfig.get_scheduler_cls`` returns without ``--scheduler-cls``."""
    if vllm_config.scheduler_config.async_scheduling:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def counter_for(vllm_config) -> TokenCounts | None:
    """The counter for this engine core when the switch is on and the file is usable; else None (logged)."""
    cfg = _settings.switched_on(getattr(vllm_config, "additional_config", None), FEATURE)
    if cfg is None:
        return None
    par = vllm_config.parallel_config
    # data_parallel_index: every engine core's own (data_parallel_rank is set per engine only for MoE models)
    path = counts_path(cfg.path, par.data_parallel_index, par.data_parallel_size)
    try:
        counts = TokenCounts(path, int(vllm_config.model_config.get_vocab_size()), cfg.flush_seconds,
                             cfg.flush_tokens, cfg.switch or None)
    except CountsError as e:
        fail_closed(FEATURE, str(e))
        return None
    info("capture on: counting emitted token ids into %s (flush every %gs or %d tokens)%s %s",
         path, cfg.flush_seconds, cfg.flush_tokens,
         f" while {cfg.switch} exists (now: {'on' if counts.on else 'off'})" if cfg.switch else "", process_tag())
    return counts


def scheduler(vllm_config, *args, **kwargs):
    """The ``--scheduler-cls`` target: the stock scheduler, counting emitted ids when capture is on."""
    base = _stock_class(vllm_config)
    counts = counter_for(vllm_config)
    if counts is None:
        return base(vllm_config, *args, **kwargs)
    sched = _capturing(base)(vllm_config, *args, **kwargs)
    sched._spark_counts = counts
    counts.start()
    atexit.register(counts.stop)  # best effort: vLLM may kill the engine core before shutdown() runs
    return sched
