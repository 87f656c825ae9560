"""The capture overlay without vLLM: counting, the flush schedule, atomic flushes, the switch, the drift check."""

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spark_overlays import capture, check
from spark_overlays import settings as S

from .test_check import SOURCES, _edit, _minimal_copy


def _counts(tmp_path, vocab=10, seconds=60.0, tokens=1000):
    return capture.TokenCounts(tmp_path / "counts.npy", vocab, seconds, tokens)


def test_counts_are_a_histogram_of_the_ids_flushed_as_int64_npy(tmp_path):
    c = _counts(tmp_path)
    c.add(np.array([1, 2, 2, 9], dtype=np.int64))
    c.add(np.array([2, -1, 10, 12], dtype=np.int64))  # placeholders / ids past the vocabulary are not counted
    assert not c.path.exists()  # not due yet
    c.flush()
    raw = c.path.read_bytes()
    arr = np.load(c.path, allow_pickle=False)
    assert arr.dtype == np.int64 and arr.shape == (10,)
    assert arr.tolist() == [0, 1, 3, 0, 0, 0, 0, 0, 0, 1]
    assert raw[:6] == b"\x93NUMPY" and len(raw) == len(raw.split(b"\n", 1)[0]) + 1 + 10 * 8  # header + counts only
    assert os.listdir(tmp_path) == ["counts.npy"]  # no temp file left


def test_flush_schedule_tokens_seconds_and_restart_accumulates(tmp_path):
    c = _counts(tmp_path, seconds=0.05, tokens=5)
    c.add(np.array([1, 1, 1, 1]))
    assert not c.path.exists()
    c.add(np.array([3]))  # fifth token: flushed inline
    assert capture.read_counts(c.path, 10)[[1, 3]].tolist() == [4, 1]
    c.add(np.array([4]))  # pending; an idle engine makes no step, the timer thread flushes it
    c.start()
    deadline = time.monotonic() + 10
    while capture.read_counts(c.path, 10)[4] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    c.stop()
    assert capture.read_counts(c.path, 10)[4] == 1
    again = _counts(tmp_path)  # a restarted engine adds to the file
    again.add(np.array([1]))
    again.stop()
    assert capture.read_counts(c.path, 10)[[1, 3, 4]].tolist() == [5, 1, 1]
    assert not c._thread.is_alive()  # stop() ends the flush thread


def test_deleting_the_file_clears_the_capture_while_counting(tmp_path):
    c = _counts(tmp_path)
    c.add(np.array([1, 2]))
    c.flush()
    c.path.unlink()  # `vocab capture clear`
    c.add(np.array([3]))
    c.flush()
    assert capture.read_counts(c.path, 10).tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]


def test_a_failed_flush_keeps_the_old_file_and_stops_capture(tmp_path, monkeypatch, caplog):
    c = _counts(tmp_path)
    c.add(np.array([5]))
    c.flush()
    before = c.path.read_bytes()
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(capture.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(capture.os, "replace", broken_replace)
    c.add(np.array([6]))
    with caplog.at_level("WARNING", logger="vllm.spark_overlays"):
        c.flush()
    assert synced  # the temp file was fsynced before the (failed) rename
    assert c.path.read_bytes() == before and os.listdir(tmp_path) == ["counts.npy"]
    assert not c.active and "capture DISABLED" in caplog.text and "No space left" in caplog.text
    c.add(np.array([7]))
    assert c.pending == 0  # stopped: nothing more is counted


@pytest.mark.parametrize("content, reason", [
    (np.zeros(12, dtype=np.int64), "holds counts for 12 ids"),
    (np.zeros(10, dtype=np.float64), "expected a 1-D int64 array"),
    (np.array(["the", "text"]), "expected a 1-D int64 array"),
    (np.full(10, -1, dtype=np.int64), "negative counts"),
])
def test_a_foreign_file_is_refused_at_start_naming_it(tmp_path, content, reason):
    p = tmp_path / "counts.npy"
    np.save(p, content)
    with pytest.raises(capture.CountsError, match=reason) as e:
        capture.TokenCounts(p, 10, 60, 1000)
    assert str(p) in str(e.value)
    p.write_bytes(b"not numpy")
    with pytest.raises(capture.CountsError, match="not a counts file"):
        capture.read_counts(p)
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"prompt": "secret"}], dtype=object), allow_pickle=True)
    with pytest.raises(capture.CountsError, match="not a counts file"):
        capture.read_counts(obj)  # never unpickled


def _config(tmp_path, vocab=10, dp=(0, 1), **cap):
    extra = {"spark_overlays": {"capture": cap}} if cap else {}
    return SimpleNamespace(additional_config=extra,
                           parallel_config=SimpleNamespace(data_parallel_index=dp[0], data_parallel_size=dp[1]),
                           model_config=SimpleNamespace(get_vocab_size=lambda: vocab))


def test_switch_off_by_default_and_fail_closed(tmp_path, caplog):
    assert capture.counter_for(_config(tmp_path)) is None
    assert capture.counter_for(_config(tmp_path, enabled=False, path=str(tmp_path / "c.npy"))) is None
    with caplog.at_level("WARNING", logger="vllm.spark_overlays"):
        assert capture.counter_for(_config(tmp_path, enabled=True)) is None
        assert capture.counter_for(_config(tmp_path, enabled=True, path=str(tmp_path / "no" / "c.npy"))) is None
    assert "capture.path is required" in caplog.text and "does not exist" in caplog.text
    on = capture.counter_for(_config(tmp_path, enabled=True, path=str(tmp_path / "c.npy"), flush_seconds=5,
                                     flush_tokens=7))
    assert (on.path, on.vocab_size, on.flush_seconds, on.flush_tokens) == (tmp_path / "c.npy", 10, 5, 7)
    dp = capture.counter_for(_config(tmp_path, dp=(1, 2), enabled=True, path=str(tmp_path / "c.npy")))
    assert dp.path == tmp_path / "c.dp1.npy"


@pytest.mark.parametrize("raw, where", [
    ({"enabled": True, "path": "/x", "flush_seconds": 0}, "capture.flush_seconds must be positive"),
    ({"enabled": True, "path": "/x", "flush_tokens": 1.5}, "capture.flush_tokens has the wrong type"),
    ({"enabled": True, "path": "/x", "text": True}, "capture.text is not a known key"),
])
def test_settings_errors_name_the_key(raw, where):
    with pytest.raises(S.SettingsError, match=where):
        S.parse({"spark_overlays": {"capture": raw}})
    assert S.parse({"spark_overlays": {"capture": {"enabled": True, "path": "/x", "flush_seconds": 0.5}}}
                   ).capture == S.Capture(True, "/x", flush_seconds=0.5, flush_tokens=1_000_000)


class FakeScheduler:
    """Stands in for vllm's Scheduler: update_from_output returns {client: EngineCoreOutputs}."""

    def __init__(self, vllm_config, *args, **kwargs):
        self.steps = []
        self.shut = False

    def update_from_output(self, scheduler_output, model_runner_output):
        return {c: SimpleNamespace(outputs=[SimpleNamespace(new_token_ids=ids) for ids in reqs])
                for c, reqs in model_runner_output.items()}

    def shutdown(self):
        self.shut = True


def test_capturing_scheduler_counts_every_client_and_flushes_at_shutdown(tmp_path, caplog):
    cls = capture._capturing(FakeScheduler)
    assert capture._capturing(FakeScheduler) is cls and issubclass(cls, FakeScheduler)  # loading twice: one class
    s = cls(None)
    s._spark_counts = _counts(tmp_path)
    out = s.update_from_output(None, {0: [[1, 2], []], 1: [[2, 2, 9]]})
    assert [o.new_token_ids for o in out[1].outputs] == [[2, 2, 9]]  # outputs pass through unchanged
    s.update_from_output(None, {0: [[3]]})
    s.shutdown()
    assert s.shut and capture.read_counts(tmp_path / "counts.npy", 10).tolist() == [0, 1, 3, 1, 0, 0, 0, 0, 0, 1]
    with caplog.at_level("WARNING", logger="vllm.spark_overlays"):
        assert s.update_from_output(None, {0: [["x"]]})  # a surprise in the outputs: serving goes on
    assert not s._spark_counts.active and "counting failed" in caplog.text


def test_the_factory_builds_the_stock_class_when_off_and_the_capturing_one_when_on(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "_stock_class", lambda vllm_config: FakeScheduler)
    path = tmp_path / "c.npy"
    off = capture.scheduler(_config(tmp_path, enabled=False, path=str(path)), kv_cache_config=None)
    assert type(off) is FakeScheduler  # off: vLLM's own class, nothing added
    off.update_from_output(None, {0: [[1, 2]]})
    off.shutdown()
    on = capture.scheduler(_config(tmp_path, enabled=True, path=str(path), flush_seconds=3600),
                           kv_cache_config=None)
    assert type(on).__name__ == "CapturingFakeScheduler"
    on.update_from_output(None, {0: [[1, 2]]})
    assert not path.exists()  # nothing is due yet
    on.shutdown()
    assert capture.read_counts(path).tolist() == [0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert not on._spark_counts._thread.is_alive()


def test_module_imports_neither_vllm_nor_torch():
    code = "import spark_overlays.capture, sys; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.stdout.strip() == "False False", out.stderr


@pytest.mark.parametrize("label", list(SOURCES))
def test_drift_in_the_emitted_ids_fails_check(tmp_path, label):
    src = SOURCES[label]
    if src is None:
        pytest.skip(f"{label} not available")
    tree = _minimal_copy(src, tmp_path)
    _edit(tree / "vllm" / "v1" / "core" / "sched" / "scheduler.py", "new_token_ids=new_token_ids,",
          "new_token_ids=[],")
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", str(tree)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "DRIFT capture: vllm.v1.core.sched.scheduler:Scheduler.update_from_output" in out.stderr


def test_the_run_time_switch_file_turns_counting_on_and_off_without_a_restart(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "SWITCH_POLL_S", 0.02)
    switch = tmp_path / "on"
    c = capture.TokenCounts(tmp_path / "counts.npy", 10, 3600, 1000, switch)
    cls = capture._capturing(FakeScheduler)
    s = cls(None)
    s._spark_counts = c
    c.start()
    s.update_from_output(None, {0: [[1, 2]]})
    assert not c.on and c.pending == 0  # no switch file: nothing counted

    def wait(cond):
        deadline = time.monotonic() + 10
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cond()

    switch.touch()  # `vocab capture on`
    wait(lambda: c.on)
    s.update_from_output(None, {0: [[3, 3]]})
    assert c.pending == 2 and not c.path.exists()  # counted, not due before flush_seconds (an hour)
    switch.unlink()  # `vocab capture off`: what was counted while on is flushed at once, then nothing more
    wait(lambda: c.path.exists())
    s.update_from_output(None, {0: [[4]]})
    s.shutdown()
    assert capture.read_counts(c.path, 10).tolist() == [0, 0, 0, 2, 0, 0, 0, 0, 0, 0]


def test_a_switch_never_turned_on_leaves_no_counts_file(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "_stock_class", lambda vllm_config: FakeScheduler)
    path = tmp_path / "c.npy"
    s = capture.scheduler(_config(tmp_path, enabled=True, path=str(path), switch=str(tmp_path / "on"),
                                  flush_seconds=0.01), kv_cache_config=None)
    assert type(s).__name__ == "CapturingFakeScheduler"  # wired, so `on` needs no restart
    s.update_from_output(None, {0: [[1, 2]]})
    time.sleep(0.05)
    s.shutdown()
    assert not path.exists() and os.listdir(tmp_path) == []
