"""Exit codes of the ``brooq`` command, and the one error type for bad command-line input."""

from __future__ import annotations

from enum import IntEnum

from brooq.vocabulary import InvalidInput


class Exit(IntEnum):
    """What the process's exit code means."""

    OK = 0
    """The command did what was asked."""
    FAILED = 1
    """An operation failed: unknown job, nothing to change, the database is down."""
    USAGE = 2
    """Bad input or configuration: every problem listed, one per line; nothing was done."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (128 + SIGINT)."""
    BUG = 70
    """An internal error (EX_SOFTWARE): brooq itself failed; please report it."""


class UsageError(InvalidInput):
    """The command line asks for something impossible; exit code 2."""
