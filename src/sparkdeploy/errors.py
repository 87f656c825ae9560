"""One error family per concern; each carries what it is about (file, field, node) so the CLI can say it in one line.

Modules below the CLI raise these and never call sys.exit; the CLI maps them to exit codes.
"""

from __future__ import annotations

import traceback
from typing import Callable


class SparkdeployError(Exception):
    """Base of every error the CLI reports as one clear line."""

    exit_code = 1


class InputError(SparkdeployError):
    """Bad user input: nothing was changed; exit code 2."""

    exit_code = 2


class ExtraMissing(InputError):
    """A command needs an optional part of sparkdeploy (`pip install 'sparkdeploy[EXTRA]'`) that is not installed."""


class InventoryError(InputError):
    """An inventory, profile or facts file is invalid; names the file and the field path."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file, self.field, self.reason = file, field, message
        where = ": ".join(p for p in (file, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class PlanError(InputError):
    """The inventory is valid but cannot be planned safely (e.g. a node's facts lack a declared netdev)."""

    def __init__(self, message: str, *, node: str | None = None):
        self.node = node
        super().__init__(message)


class BudgetError(PlanError):
    """A node's memory budget cannot keep the reserve (doctor reports it on that node's memory line)."""


class VocabError(InputError):
    """A draft vocabulary, tokenizer or corpus is unusable."""


class RemoteError(SparkdeployError):
    """A command or transfer on a node failed; names the node."""

    def __init__(self, message: str, *, node: str | None = None):
        self.node = node
        super().__init__(f"{node}: {message}" if node else message)


class HealthError(SparkdeployError):
    """The service did not become or stay healthy."""


class SimError(SparkdeployError):
    """The simulated cluster could not be built, started or reached."""


class BenchError(SparkdeployError):
    """A measurement could not be taken or compared honestly."""


class Interrupted(SparkdeployError):
    """SIGINT or SIGTERM reached a command that changes the cluster: handled like any failure (the last good
    release serves again); exit code 130, as a shell reports an interrupted command."""

    exit_code = 130


# The line above the traceback of an unforeseen failure that a rollback then handled (tests tell it from a crash).
UNFORESEEN = "unexpected error (one the kit did not foresee; its traceback, for a bug report)"


def describe(err: BaseException, log: Callable[[str], None] | None = None) -> str:
    """One line for a failure that ends a switch. Past the first stop every failure rolls back, the unforeseen
    ones too: an `up` that died on one left the watchdog off and an ungated release current (CI, 2026-12-06).
    Ours say what they are about; anything else is a bug in the kit or a library: it keeps its type, and with
    `log` its traceback goes there under UNFORESEEN."""
    if isinstance(err, SparkdeployError):
        return str(err)
    if log is not None:
        log(f"{UNFORESEEN}:\n" + "".join(traceback.format_exception(err)).rstrip())
    return f"{type(err).__name__}: {err}"
