"""What a connection to a node is, whatever carries it: a `Target` (where and as whom), `Result`, `Proc` (a
running command with byte pipes) and `Conn`, whose files and links are built on one primitive, a command; and
the effects recorder (`recording`), through which every state-changing call passes. `remote` makes the
local and SSH connections; `streams` pipes bytes between them."""

from __future__ import annotations

import contextvars
import difflib
import hashlib
import posixpath
import secrets
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Sequence, TypeVar

from sparkdeploy.errors import RemoteError

CHUNK = 1 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Where a node is reached. `local=None` means: local only for localhost/loopback as the kit's own user.

    A user other than root runs every command through `sudo -n`; with `user=None` SSH logs in as the kit's own
    user and commands run as that user. `identity` may be one key file or several (tried in order).
    """

    name: str
    host: str
    port: int = 22
    user: str | None = "root"
    identity: str | tuple[str, ...] | None = None
    local: bool | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None

    @property
    def sudo(self) -> list[str]:
        return ["sudo", "-n", "--"] if self.user not in (None, "root") else []


@dataclass
class Result:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    node: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def check(self) -> "Result":
        if self.rc != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-3:]
            raise RemoteError(f"`{shlex.join(self.argv)}` exited {self.rc}: {' | '.join(tail)}", node=self.node)
        return self


class Proc:
    """A running command with a byte pipe in and out; `close_stdin` sends EOF."""

    def write(self, data: bytes) -> None: ...
    def read(self, n: int = CHUNK) -> bytes: ...
    def close_stdin(self) -> None: ...
    def wait(self, timeout: float | None = None) -> tuple[int, str]: ...
    def kill(self) -> None: ...


# ------------------------------------------------------------------------------------------- effects
# A context variable, not a thread-local: `fanout.parallel` runs each node's function in a copy of the caller's
# context, so what a step does on its nodes at once is recorded in the step's one list.
_effects: contextvars.ContextVar[tuple[list[str], bool] | None] = contextvars.ContextVar("effects", default=None)
# Paths a dry run has written (node, path): a later step of the same dry run finds them, as the real run would.
_dry_written: contextvars.ContextVar[set[tuple[str, str]] | None] = contextvars.ContextVar("dry_written",
                                                                                          default=None)


@contextmanager
def recording(*, dry: bool) -> Iterator[list[str]]:
    """Collect, as one line each, the commands and file writes made through any `Conn` in this context (and the
    nodes' threads `fanout.parallel` starts from it): the exact effects of a step's action (pyinfra's
    "operations yield commands", taken from the calls themselves, so what a dry run prints cannot drift from
    what a real run does). With `dry`, nothing reaches a node: a command answers success with the output its
    caller named (`Conn.run(answer=)`, a placeholder such as `<image id of TAG built on node1>`; else none), a
    write is dropped (its line carries the diff against the node's file, `Effect.diff`). Reads (`query`, `get`,
    `exists`) always go through and are never recorded. This is the one place that asks whether a run is dry:
    effect code never does (tests/unit/test_dry_run.py)."""
    log: list[str] = []
    token = _effects.set((log, dry))
    try:
        yield log
    finally:
        _effects.reset(token)


@contextmanager
def dry_session() -> Iterator[None]:
    """One dry run across several recordings: a file one step would write `exists` for the next (a release
    written by the release step is there to switch to)."""
    token = _dry_written.set(set())
    try:
        yield
    finally:
        _dry_written.reset(token)


def dry() -> bool:
    """Is this context recording a dry run (nothing carried out)?"""
    state = _effects.get()
    return bool(state and state[1])


@contextmanager
def _not_recorded() -> Iterator[None]:
    token = _effects.set(None)
    try:
        yield
    finally:
        _effects.reset(token)


def record(line: str) -> bool:
    """Log an effect if recording; True when it must not be carried out (dry run). The recorder's own switch:
    effect code calls `effect` (or `Conn.run`/`put`/`symlink`), never this."""
    state = _effects.get()
    if state is None:
        return False
    state[0].append(line)
    return state[1]


def effect(line: str, carry_out: Callable[[], T], answer: T) -> T:
    """An effect made by other means than `Conn.run/put/symlink` (a build context fed through a byte stream, an
    SSH tunnel): recorded as `line`; carried out, or in a dry run answered with `answer`, a named placeholder
    for what it would return (`<image id of TAG built on node1>`), so the code after it runs the same way."""
    return answer if record(line) else carry_out()


@contextmanager
def held(open_: Callable[[], ContextManager[T]], answer: T) -> Iterator[T]:
    """A means to later effects held open on this machine (an SSH tunnel), itself no change to a node: opened,
    or in a dry run stood in for by `answer`, a named placeholder (`<tunnel to 10.0.0.1:5000>`) the effects it
    carries show."""
    if dry():
        yield answer
        return
    with open_() as it:
        yield it


def narrate(log: Callable[[str], None], msg: str) -> None:
    """Progress for the user about an effect being carried out; silent in a dry run, whose effect lines say
    what would be done."""
    if not dry():
        log(msg)


def _record_write(node: str, path: str, line: str) -> bool:
    """`record` for a file or link write; a dry run remembers the path for `exists` (see `dry_session`)."""
    if not record(line):
        return False
    written = _dry_written.get()
    if written is not None:
        written.add((node, path))
    return True


def _shown(arg: str) -> str:
    """An argument as an effect line shows it: a long one (a script passed with -c) by size and hash."""
    if len(arg) <= 240:
        return arg
    return f"<{len(arg)} chars sha256:{hashlib.sha256(arg.encode()).hexdigest()[:12]}>"


class Effect(str):
    """An effect line (compared and stored as the plain string, so a dry run's lines equal the real run's), with
    what a dry run shows under it: `diff`, the change a file write makes to the file on the node."""

    diff: str = ""


DIFF_MAX_BYTES = 64 * 1024  # a larger file is shown by size and hash only


def shows_diff(data: bytes, mode: int) -> bool:
    """Is a write of `data` shown as a diff? Small text that every user of the node may read; never a file only
    its owner may read (a key, an env file of secrets), whose content a dry run must not print."""
    return bool(mode & 0o004) and len(data) <= DIFF_MAX_BYTES and b"\0" not in data


def write_diff(where: str, old: bytes | None, new: bytes) -> str:
    """The unified diff a write of `new` makes to `old` (None: no file yet), for a dry run to show; "" where
    either side is not small text (the effect line's size and sha256 stand alone)."""
    if old is not None and (len(old) > DIFF_MAX_BYTES or b"\0" in old):
        return ""
    try:
        before, after = (old or b"").decode(), new.decode()
    except UnicodeDecodeError:
        return ""
    if old is not None and before == after:
        return "(content unchanged)"
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 "/dev/null" if old is None else f"{where} (on the node)", f"{where} (this run)")
    return "".join(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in lines).rstrip("\n")


class Conn:
    """One node. Subclasses implement `_run` (one command), `popen`; files and links are built on them."""

    target: Target

    @property
    def name(self) -> str:
        return self.target.name

    def run(self, argv: Sequence[str], *, timeout: float = 120, check: bool = True, input: bytes | None = None,
            answer: str = "") -> Result:
        """A command that changes the node: recorded; in a dry run not carried out but answered with success and
        `answer` on stdout (a named placeholder where later effects depend on the output)."""
        argv = [str(a) for a in argv]
        stdin = f" <{len(input)} bytes sha256:{hashlib.sha256(input).hexdigest()[:12]}>" if input is not None else ""
        if record(f"{self.name}: run {shlex.join(_shown(a) for a in argv)}{stdin}"):
            return Result(argv, 0, answer, "", self.name)
        return self._run(argv, timeout=timeout, check=check, input=input)

    def query(self, argv: Sequence[str], *, timeout: float = 120, check: bool = True,
              answer: str | None = None) -> Result:
        """A command that only reads the node's state (a fact): carried out and not recorded, in a dry run too.
        `answer`: this read looks at what this run's own effects made (an image pulled, a service restarted);
        a dry run made none, so there the recorder answers it (success, `answer` on stdout) instead of the node."""
        if answer is not None and dry():
            return Result([str(a) for a in argv], 0, answer, "", self.name)
        with _not_recorded():
            return self.run(argv, timeout=timeout, check=check)

    def _run(self, argv: list[str], *, timeout: float, check: bool, input: bytes | None) -> Result:
        raise NotImplementedError

    def put(self, path: str, data: bytes, *, mode: int = 0o644, owner: str | None = None) -> None:
        """Write to a temp file beside `path`, set mode/owner, fsync, rename over. On failure the temp is removed
        and `path` is untouched (disk full leaves the old file in place). Through `run`, so through sudo."""
        line = Effect(f"{self.name}: write {path} mode {mode:04o}{' owner ' + owner if owner else ''} "
                      f"{len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:12]}")
        if dry() and shows_diff(data, mode):
            line.diff = self._diff_against_node(path, data)
        if _record_write(self.name, path, line):
            return
        with _not_recorded():
            self._put(path, data, mode=mode, owner=owner)

    def _diff_against_node(self, path: str, data: bytes) -> str:
        """What writing `data` changes in the node's file (a read); "" when the file cannot be read."""
        try:
            return write_diff(f"{self.name}:{path}", self.get(path), data)
        except RemoteError:
            return ""

    def _put(self, path: str, data: bytes, *, mode: int, owner: str | None) -> None:
        tmp = _atomic_tmp(path)
        try:
            res = self.run(
                ["sh", "-c", 'umask 077 && cat > "$1" && chmod "$2" "$1" && sync "$1"', "put", tmp, format(mode, "o")],
                input=data,
                check=False,
                timeout=max(60, len(data) / 5e6),
            )
            if not res.ok:
                raise RemoteError(f"writing {path} failed: {res.stderr.strip() or 'exit ' + str(res.rc)}", node=self.name)
            if owner:
                self.run(["chown", owner, tmp])
            self.run(["mv", "-f", tmp, path])
        except RemoteError:
            try:
                self.run(["rm", "-f", tmp], check=False, timeout=15)
            except RemoteError:
                pass
            raise

    def get(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        p = self.popen(["cat", path])
        p.close_stdin()
        out = bytearray()
        while True:
            b = p.read(CHUNK)
            if not b:
                break
            out += b
        rc, _ = p.wait(120)
        if rc != 0:
            if not self.exists(path):
                return None
            raise RemoteError(f"reading {path} failed (exit {rc})", node=self.name)
        return bytes(out)

    def popen(self, argv: Sequence[str]) -> Proc:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Convenience built on run/put.
    def sh(self, script: str, *, timeout: float = 120, check: bool = True) -> Result:
        """Run a fixed script (kit text, never inventory values spliced in) under `sh -c`."""
        return self.run(["sh", "-c", script], timeout=timeout, check=check)

    def exists(self, path: str) -> bool:
        written = _dry_written.get()
        if written is not None and dry() and (self.name, path) in written:
            return True
        return self.query(["test", "-e", path], check=False).ok

    def symlink(self, link: str, dest: str) -> None:
        """Point `link` at `dest` atomically (new link beside it, then rename over)."""
        if _record_write(self.name, link, f"{self.name}: link {link} -> {dest}"):
            return
        tmp = f"{link}.sparkdeploy-tmp-{secrets.token_hex(4)}"
        with _not_recorded():
            self.run(["ln", "-sfn", dest, tmp])
            self.run(["mv", "-Tf", tmp, link])


def _atomic_tmp(path: str) -> str:
    d, base = posixpath.split(path)
    return posixpath.join(d, f".{base}.sparkdeploy-tmp-{secrets.token_hex(4)}")
