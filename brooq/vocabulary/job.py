"""What producers enqueue (:class:`Job`) and what the store reports back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from brooq.vocabulary.durations import format_duration
from brooq.vocabulary.errors import InvalidJob, InvalidKindOptions
from brooq.vocabulary.options import (
    JOB_OVERRIDES,
    DurationLike,
    KindOptions,
    job_overrides,
    stored_overrides,
)
from brooq.vocabulary.parents import HasJobId, IfParentFails, check_policy, parent_ids
from brooq.vocabulary.state import State
from brooq.vocabulary.topic import Topic

IDEMPOTENCY_KEY_MAX_LENGTH = 512
PRIORITY_RANGE = range(-32768, 32768)
_set = object.__setattr__  # a frozen dataclass sets its own fields this way
TRACE_CONTEXT_MAX_CHARS = 4096
"""The longest trace context a job carries, as JSON (W3C traceparent and tracestate take
under 600)."""


@dataclass(frozen=True, slots=True)
class Job:
    """A job to enqueue.

    ``payload`` is any JSON-serializable value. ``idempotency_key``
    deduplicates per topic for the life of the row; ``""`` or None means no
    key. ``available_at`` (timezone-aware) delays the first attempt; None means
    now. ``priority`` (a small int, default 0): higher runs first among ready
    jobs of a topic. ``rate_key`` (``""`` or None: none) applies the topic's
    ``rate_limit`` to the jobs of each key separately (a tenant, an account),
    instead of to the whole topic. ``after`` (job ids, or the Enqueued values
    enqueue returned) makes it wait, in state ``waiting``, until every one of
    those jobs (its parents) has ended; ``if_parent_fails`` says what then
    happens when one of them ended ``dead`` or ``canceled``, or does not exist:
    ``"cancel"`` (the default) cancels it, ``"run"`` runs it anyway.

    ``max_attempts``, ``attempt_timeout``, ``max_execution_timeout``,
    ``backoff_base`` and ``backoff_max`` (None: the kind's) override the kind's
    options for this job alone; they are checked as a kind's options are
    (durations: a timedelta, seconds, or text with units such as ``"10s"``).
    ``trace_context`` is a propagation carrier (``{"traceparent": …}``, text
    to text) stored with the job, outside its payload; brooq's tracing
    middleware writes and reads it. Invalid values raise :class:`InvalidJob`
    or ``InvalidTopic`` here, before anything is written.
    """

    topic: str
    payload: Any = None
    idempotency_key: str | None = None
    available_at: datetime | None = None
    priority: int = 0
    rate_key: str | None = None
    after: Sequence[str | HasJobId] = ()
    if_parent_fails: IfParentFails = "cancel"
    max_attempts: int | None = None
    attempt_timeout: timedelta | None = None
    max_execution_timeout: timedelta | None = None
    backoff_base: timedelta | None = None
    backoff_max: timedelta | None = None
    trace_context: Mapping[str, str] | None = None
    _topic: Topic = field(init=False, repr=False, compare=False)
    _overrides: KindOptions | None = field(init=False, repr=False, compare=False, default=None)

    if TYPE_CHECKING:  # what the constructor accepts; the fields always hold timedeltas

        def __init__(
            self,
            topic: str,
            payload: Any = None,
            idempotency_key: str | None = None,
            available_at: datetime | None = None,
            priority: int = 0,
            rate_key: str | None = None,
            after: Sequence[str | HasJobId] = (),
            if_parent_fails: IfParentFails = "cancel",
            max_attempts: int | None = None,
            attempt_timeout: DurationLike | None = None,
            max_execution_timeout: DurationLike | None = None,
            backoff_base: DurationLike | None = None,
            backoff_max: DurationLike | None = None,
            trace_context: Mapping[str, str] | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        # Written for speed as well as checking (a bulk enqueue makes thousands a second);
        # every check of the slower spelling is kept.
        _set(self, "_topic", Topic(self.topic))
        if self.after != ():
            _set(self, "after", parent_ids(self.after))
        if self.if_parent_fails != "cancel":
            check_policy(self.if_parent_fails)
        if self.idempotency_key is not None:
            _check_key("idempotency_key", self.idempotency_key)
            if self.idempotency_key == "":
                _set(self, "idempotency_key", None)
        if self.rate_key is not None:
            _check_key("rate_key", self.rate_key)
            if self.rate_key == "":
                _set(self, "rate_key", None)
        prio = self.priority
        if type(prio) is not int and (isinstance(prio, bool) or not isinstance(prio, int)):
            raise InvalidJob(f"priority must be an integer from -32768 to 32767, got {prio!r}")
        if not -32768 <= prio <= 32767:
            raise InvalidJob(f"priority must be an integer from -32768 to 32767, got {prio!r}")
        at = self.available_at
        if at is not None:
            if not isinstance(at, datetime):
                raise InvalidJob(f"available_at must be a datetime, not {type(at).__name__}")
            if at.tzinfo is None or at.utcoffset() is None:
                raise InvalidJob(
                    "available_at must be timezone-aware, e.g. datetime.now(timezone.utc)"
                )
        if (
            self.max_attempts is not None
            or self.attempt_timeout is not None
            or self.max_execution_timeout is not None
            or self.backoff_base is not None
            or self.backoff_max is not None
        ):
            self._check_overrides()
        if self.trace_context is not None:
            object.__setattr__(self, "trace_context", _trace_context(self.trace_context))

    def _check_overrides(self) -> None:
        """Check the overrides as a kind's options are checked, and keep them coerced."""
        try:
            overrides = job_overrides(**{name: getattr(self, name) for name in JOB_OVERRIDES})
        except InvalidKindOptions as exc:
            raise InvalidJob(str(exc)) from None
        object.__setattr__(self, "_overrides", overrides)
        for name in JOB_OVERRIDES:
            object.__setattr__(self, name, getattr(overrides, name))

    @property
    def overrides(self) -> KindOptions | None:
        """The kind options this job sets for itself (None: it sets none)."""
        return self._overrides

    def controls(self) -> dict[str, Any]:
        """Its overrides and trace context, as the fields of the JobRecord that stores it."""
        trace = self.trace_context
        return {
            **{name: getattr(self, name) for name in JOB_OVERRIDES},
            "trace_context": None if trace is None else dict(trace),
        }

    @property
    def after_ids(self) -> tuple[str, ...]:
        """The ids of ``after``, canonical, each once, in the order given."""
        return self.after  # type: ignore[return-value]  # normalised in __post_init__


class Enqueued(tuple[str, bool]):
    """The result of an enqueue: ``(id, created)``, and the row's ``state``.

    It unpacks as a pair (``job_id, created = queue.enqueue(job)``).
    ``created`` is False when a row with the same (topic, idempotency_key)
    already existed, whatever its state; ``id`` and ``state`` are then that
    row's, so a caller can tell a key held by a ``dead`` job (which will not
    run again) from one still queued. To run a dead job's work again, enqueue
    it without the key, or delete the dead row and enqueue again in one
    transaction (a key is free once its row is gone).
    """

    state: State = State.PENDING  # a class default: most are, and a bulk enqueue makes many

    def __new__(cls, id: str, created: bool, state: State = State.PENDING) -> Enqueued:
        self = super().__new__(cls, (id, created))
        if state is not State.PENDING:
            self.state = state
        return self

    @classmethod
    def pending(cls, ids: Sequence[str]) -> list[Enqueued]:
        """``Enqueued(id, True)`` for each of ``ids``: jobs written, pending (fast, for bulk)."""
        new = tuple.__new__
        return [new(cls, (job_id, True)) for job_id in ids]

    @property
    def id(self) -> str:
        """The job's id (the existing row's when not created)."""
        return self[0]

    @property
    def created(self) -> bool:
        """True when this call wrote the row."""
        return self[1]

    def __repr__(self) -> str:
        return f"Enqueued(id={self.id!r}, created={self.created!r}, state={str(self.state)!r})"


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of the ``job`` table: the whole fate of a job."""

    id: str
    topic: str
    payload: Any
    state: State
    attempts: int
    priority: int
    available_at: datetime
    locked_by: str | None
    locked_until: datetime | None
    idempotency_key: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    expirations: int = 0
    last_traceback: str | None = None
    expiry_streak: int = 0
    """Lease expiries since the last recorded outcome (QUEUE_MAX_EXPIRATIONS bounds it)."""
    payload_error: str | None = None
    """Why ``payload`` is None: the stored JSON is more than Python can decode."""
    result: Any = None
    """What the handler returned (decoded JSON) when the job is ``done``; None otherwise, or
    when it returned nothing."""
    rate_key: str | None = None
    """The key whose rate limit the job's claim obeys (None: the topic's own)."""
    workflow_id: str | None = None
    """The workflow the job was enqueued in (``queue.enqueue_workflow``), or None."""
    parents_left: int = 0
    """How many of its parents have not ended (what a ``waiting`` job waits for)."""
    if_parent_fails: str | None = None
    """The policy of a job with parents (``cancel`` or ``run``); None for a job without."""
    max_attempts: int | None = None
    """The job's own max_attempts (None: its kind's); so for the four below."""
    attempt_timeout: timedelta | None = None
    max_execution_timeout: timedelta | None = None
    backoff_base: timedelta | None = None
    backoff_max: timedelta | None = None
    trace_context: dict[str, str] | None = None
    """The trace context its enqueue stored (tracing middleware), or None."""
    app_version: str | None = None
    """The app version of the code that enqueued it (None: unversioned); only supervisors
    of that version (or none, when it is None) claim it."""

    @property
    def overrides(self) -> KindOptions | None:
        """The kind options this job sets for itself (None: it sets none)."""
        return stored_overrides([getattr(self, name) for name in JOB_OVERRIDES])

    @property
    def charged_attempts(self) -> int:
        """Attempts that count against ``max_attempts``: taken, less lease expiries."""
        return self.attempts - self.expirations

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-friendly values (timestamps in ISO 8601)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, timedelta):
                value = format_duration(value)
            out[name] = value
        out["state"] = str(self.state)
        return out


def _trace_context(carrier: object) -> dict[str, str]:
    """A trace context as stored: text keys to text values, bounded (InvalidJob otherwise)."""
    if not isinstance(carrier, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()
    ):
        raise InvalidJob(
            "trace_context must map text to text, like {'traceparent': '00-…'}, "
            f"not {carrier!r:.80}"
        )
    out = dict(carrier)
    size = len(json.dumps(out, ensure_ascii=False))
    if size > TRACE_CONTEXT_MAX_CHARS:
        raise InvalidJob(
            f"trace_context is {size} characters as JSON, above the limit of "
            f"{TRACE_CONTEXT_MAX_CHARS}; carry only the propagation headers"
        )
    for key, value in out.items():
        if "\x00" in key + value or _has_surrogate(key + value):
            raise InvalidJob(
                "trace_context holds a NUL or a lone surrogate, which JSON in PostgreSQL rejects"
            )
    return out


def _check_key(name: str, key: object) -> None:
    if not isinstance(key, str):
        raise InvalidJob(f"{name} must be a string, not {type(key).__name__}")
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise InvalidJob(
            f"{name} is {len(key)} characters, above the limit of "
            f"{IDEMPOTENCY_KEY_MAX_LENGTH}; hash long keys (e.g. sha256) first"
        )
    if not key.isprintable() and _has_surrogate(key):
        raise InvalidJob(f"{name} holds a lone surrogate, which is not valid UTF-8")
    if "\x00" in key:
        raise InvalidJob(f"{name} holds a NUL character, which PostgreSQL rejects")


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)
