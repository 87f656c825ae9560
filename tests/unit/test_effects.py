"""The effects recorder (connection.recording): what a dry run lists is what a real run makes, including what a
step does on its nodes at once (fanout.parallel), and reads are never listed and always carried out."""

from __future__ import annotations

from sparkdeploy.fanout import parallel
from sparkdeploy.remote.connection import Target, dry_session, recording
from sparkdeploy.remote.ssh import LocalConn


def _conns(n: int = 3) -> list[LocalConn]:
    return [LocalConn(Target(f"n{i}", "localhost", local=True)) for i in range(n)]


def test_parallel_work_is_recorded_in_the_callers_recording(tmp_path):
    conns = _conns()
    with recording(dry=True) as made:
        parallel(conns, lambda c: c.run(["touch", str(tmp_path / c.name)]))
    assert sorted(made) == [f"n{i}: run touch {tmp_path / f'n{i}'}" for i in range(3)]
    assert not any((tmp_path / f"n{i}").exists() for i in range(3))  # dry: nothing was made
    with recording(dry=False) as made:
        parallel(conns, lambda c: c.run(["touch", str(tmp_path / c.name)]))
    assert len(made) == 3 and all((tmp_path / f"n{i}").exists() for i in range(3))


def test_a_query_is_carried_out_and_never_recorded(tmp_path):
    (tmp_path / "f").write_text("x\n")
    c = _conns(1)[0]
    with recording(dry=True) as made:
        assert c.query(["cat", str(tmp_path / "f")]).stdout == "x\n"
        assert c.run(["cat", str(tmp_path / "f")]).stdout == ""  # a command under a dry run answers nothing
    assert made == [f"n0: run cat {tmp_path / 'f'}"]


def test_a_dry_session_sees_its_own_writes_and_only_in_the_dry_run(tmp_path):
    c, path = _conns(1)[0], str(tmp_path / "release.json")
    with dry_session():
        with recording(dry=True):
            c.put(path, b"{}")
        with recording(dry=True):
            assert c.exists(path)  # the next step of the same dry run finds it, as the real run would
        assert not c.exists(path)  # outside the dry recording, the node's real state
    assert not (tmp_path / "release.json").exists()


def test_a_long_argument_is_shown_by_size_and_hash():
    c = _conns(1)[0]
    with recording(dry=True) as made:
        c.run(["python3", "-c", "x = 1\n" * 100, "evict", "/models/x"])
    assert made[0].startswith("n0: run python3 -c '<600 chars sha256:") and made[0].endswith("evict /models/x")
