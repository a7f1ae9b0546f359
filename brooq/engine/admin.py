"""The Admin port: the operators' writes (retry, cancel many, purge), each guarded in SQL.

Kept apart from the Store port (the engine never needs these to run jobs)
and from Inspection (which only reads). Every write names the states it may
touch in its own statement, so no caller can make it change a live row:

- retry: ``dead`` (or ``canceled`` when asked) → ``pending`` now (``waiting`` while one
  of its parents has not ended), attempts and expirations reset, the idempotency key
  kept; the retried job's children that had not started wait for it again;
- cancel_many: ``waiting``, ``pending`` or ``failed`` → ``canceled``;
- cancel_workflow: every job of a workflow that has not ended → ``canceled``;
- purge: deletes ``done``, ``dead`` or ``canceled`` rows, in batches (never a parent
  whose children have not ended);
- pause and resume a topic (brooq.engine.pauses);
- retarget: the app version of ``waiting``, ``pending`` or ``failed`` rows of one version
  (or none) → another (or none); running and ended rows keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from brooq.engine.filters import JobFilter
from brooq.engine.pauses import Pauses
from brooq.vocabulary import InvalidInput, State

RETRYABLE = (State.DEAD, State.CANCELED)
CANCELABLE = (State.WAITING, State.PENDING, State.FAILED)
PURGEABLE = (State.DONE, State.DEAD, State.CANCELED)
RETARGETABLE = (State.WAITING, State.PENDING, State.FAILED)
BATCH = 1000
"""Rows changed per transaction: no bulk action holds many row locks for long."""


@dataclass(frozen=True)
class BulkCancel:
    """What a bulk cancel did: ``canceled`` rows, and ``left``: rows the filter still
    matches in a cancelable state that it could not take (locked by another transaction
    that held them through every pass, or enqueued meanwhile); 0 when a limit was
    reached first."""

    canceled: int
    left: int = 0


class Admin(Pauses, Protocol):
    """What operators change. Each method returns how many rows it changed."""

    def retry(self, where: JobFilter) -> list[str]:
        """Jobs ``where`` matches in ``where.state`` (dead or canceled) back to pending now;
        the ids retried."""
        ...

    def cancel_many(self, where: JobFilter, reason: str | None = None) -> BulkCancel:
        """Cancel every waiting, pending or failed job ``where`` matches (``where.state`` if
        given) that is not locked, and say how many were left."""
        ...

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> int:
        """Cancel every job of the workflow that has not ended (running ones too), in one
        statement; how many."""
        ...

    def purge(self, where: JobFilter) -> int:
        """Delete the terminal jobs ``where`` matches in ``where.state``, batch by batch."""
        ...

    def retarget(self, where: JobFilter, from_version: str | None, to_version: str | None) -> int:
        """Move the jobs not started yet that ``where`` matches from app version
        ``from_version`` to ``to_version`` (None: unversioned), batch by batch; how many."""
        ...

    def count_retargetable(self, where: JobFilter, from_version: str | None) -> int:
        """How many jobs :meth:`retarget` of ``where`` from ``from_version`` would move now."""
        ...

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel one job that is not terminal yet (a running one too); False if it was."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def require_state(where: JobFilter, allowed: tuple[State, ...], action: str) -> State:
    """The filter's state when ``action`` may touch it; InvalidInput otherwise."""
    if where.state is None or where.state not in allowed:
        choices = "|".join(str(s) for s in allowed)
        given = f" {where.state}" if where.state else ""
        raise InvalidInput(
            f"{action} needs --state {choices} (got{given or ' none'}); "
            f"{action} never touches other rows"
        )
    return where.state
