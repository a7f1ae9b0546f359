"""The seven states of a job."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Where a job is now. ``failed`` waits for its next attempt; it is no verdict.

    ``waiting`` is a job enqueued after other jobs (its parents): it is not
    claimable until every parent has ended, then it becomes ``pending`` (or
    ``canceled``, by its ``if_parent_fails`` policy).
    """

    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"
    CANCELED = "canceled"
    WAITING = "waiting"

    @property
    def is_terminal(self) -> bool:
        """True for done, dead and canceled: states that are never overwritten."""
        return self in TERMINAL_STATES

    @property
    def is_claimable(self) -> bool:
        """True for pending and failed: states a worker may claim once available."""
        return self in CLAIMABLE_STATES


TERMINAL_STATES = frozenset({State.DONE, State.DEAD, State.CANCELED})
"""The states that end a job: a parent in one of them has ended."""
CLAIMABLE_STATES = frozenset({State.PENDING, State.FAILED})
