"""Jobs that wait for other jobs: what a child sees of a parent, and the policy for a failed one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NamedTuple, Protocol

from brooq.vocabulary.errors import InvalidJob
from brooq.vocabulary.ids import parse_job_id
from brooq.vocabulary.state import State

IfParentFails = Literal["cancel", "run"]
IF_PARENT_FAILS: tuple[IfParentFails, ...] = ("cancel", "run")
"""What a child does when a parent ends ``dead`` or ``canceled``, or does not exist:
``cancel`` it (with a reason naming the parent, and its own children by their policy), or
``run`` it anyway once every parent has ended (``claim.parents`` says which failed)."""

MAX_PARENTS = 100_000
"""The most parents one job may wait for (a fan-in of 10,000 is an ordinary one)."""


class Parent(NamedTuple):
    """What a child sees of one of its parents (``claim.parents[id]``).

    ``state`` is the parent's state now, or None when its row is gone (it never existed, or
    it was deleted by hand); ``result`` is what its handler returned when it is ``done``.
    """

    state: State | None
    result: Any = None

    @property
    def ended(self) -> bool:
        """True once the parent is done, dead or canceled (or gone)."""
        return self.state is None or self.state.is_terminal

    @property
    def failed(self) -> bool:
        """True when the parent ended without success: dead, canceled, or gone."""
        return self.state is None or self.state in (State.DEAD, State.CANCELED)


class HasJobId(Protocol):
    """Anything that names a job by its ``id``: an Enqueued, a workflow's Handle, a JobRecord."""

    @property
    def id(self) -> str:
        """The job's id."""
        ...


def parent_ids(values: Iterable[str | HasJobId], what: str = "after") -> tuple[str, ...]:
    """The ids of ``values`` (job ids, or what carries one), canonical, each once, in order.

    InvalidJob for a value that names no job (a bare string is refused: it would be read
    as one id per character).
    """
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidJob(
            f"{what} must be a list of job ids (or Enqueued values), not {type(values).__name__}"
        )
    out: dict[str, None] = {}
    for value in values:
        text = value if isinstance(value, str) else getattr(value, "id", None)
        if not isinstance(text, str):
            raise InvalidJob(
                f"{what} holds {type(value).__name__}, not a job id: give ids (strings) or the "
                "Enqueued values enqueue returned"
            )
        try:
            out[parse_job_id(text)] = None
        except ValueError as exc:
            raise InvalidJob(f"{what}: {exc}") from None
    if len(out) > MAX_PARENTS:
        raise InvalidJob(f"{what} names {len(out)} jobs, above the limit of {MAX_PARENTS}")
    return tuple(out)


def check_policy(value: object) -> IfParentFails:
    """``if_parent_fails`` checked: ``cancel`` or ``run``; InvalidJob otherwise."""
    if value not in IF_PARENT_FAILS:
        raise InvalidJob(f"if_parent_fails must be 'cancel' or 'run', not {value!r}")
    return value
