"""What producers enqueue (:class:`Job`) and what the store reports back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

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
TRACE_CONTEXT_MAX_CHARS = 4096
"""The longest trace context a job carries, as JSON (W3C traceparent and tracestate take
under 600)."""


@dataclass(frozen=True)
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

    # Not slots: a field left at its default is read from the class, so a job holds only
    # what it was given (see __init__).
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
    ) -> None:
        # A bulk enqueue makes thousands of jobs a second, most of them a topic and a
        # payload: each value is checked only when it is not its field's default, and
        # stored only then, straight into the instance's dict (a frozen dataclass's
        # generated __init__ sets all 16 fields through object.__setattr__, which cost
        # three times as much). Every check, and its order, is the same for any input.
        own = self.__dict__
        own["topic"] = topic
        own["_topic"] = Topic(topic)
        if payload is not None:
            own["payload"] = payload
        if after != ():
            own["after"] = parent_ids(after)
        if if_parent_fails != "cancel":
            own["if_parent_fails"] = check_policy(if_parent_fails)
        if idempotency_key is not None:
            _check_key("idempotency_key", idempotency_key)
            if idempotency_key != "":
                own["idempotency_key"] = idempotency_key
        if rate_key is not None:
            _check_key("rate_key", rate_key)
            if rate_key != "":
                own["rate_key"] = rate_key
        if type(priority) is not int or priority != 0:
            own["priority"] = _priority(priority)
        if available_at is not None:
            own["available_at"] = _available_at(available_at)
        if (
            max_attempts is not None
            or attempt_timeout is not None
            or max_execution_timeout is not None
            or backoff_base is not None
            or backoff_max is not None
        ):
            self._check_overrides(
                max_attempts, attempt_timeout, max_execution_timeout, backoff_base, backoff_max
            )
        if trace_context is not None:
            own["trace_context"] = _trace_context(trace_context)

    def __post_init__(self) -> None:
        """Check the fields of a ``@dataclass`` subclass of Job as Job checks its own: the
        subclass's generated __init__ sets them unchecked, then calls this (Job's own
        __init__ never does)."""
        own = self.__dict__
        given = {f: own.pop(f) for f in _INIT_FIELDS if f in own}
        Job.__init__(self, **given)

    def _check_overrides(self, *values: object) -> None:
        """Check the overrides (JOB_OVERRIDES' values, in order) as a kind's options are
        checked, and keep them coerced."""
        try:
            overrides = job_overrides(**dict(zip(JOB_OVERRIDES, values, strict=True)))
        except InvalidKindOptions as exc:
            raise InvalidJob(str(exc)) from None
        own = self.__dict__
        own["_overrides"] = overrides
        for name in JOB_OVERRIDES:
            own[name] = getattr(overrides, name)

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
        return self.after  # type: ignore[return-value]  # normalised in __init__


_INIT_FIELDS = tuple(f.name for f in fields(Job) if f.init)
"""The fields Job.__init__ takes, in order."""

_TOPIC_AND_PAYLOAD = 3
"""The most entries of a job's own dict that set nothing but its topic and payload (topic,
_topic, payload: Job.__init__ stores a field only when it is not the field's default)."""


def plain_jobs(jobs: Sequence[Job]) -> bool:
    """True when every job of ``jobs`` is a :class:`Job` that sets its topic and payload and
    nothing else: every other field at its default (what most bulk batches are).

    Told at a glance per job from what its __init__ stored, rather than field by field.
    A field given its default is not stored, nor a key given as ``""``; anything else
    stored (``after=[]`` too, kept as ``()``) makes it False, and the caller then looks
    field by field.
    """
    for job in jobs:
        if type(job) is not Job:
            return False
        own = job.__dict__
        if len(own) > _TOPIC_AND_PAYLOAD or (
            len(own) == _TOPIC_AND_PAYLOAD and "payload" not in own
        ):
            return False
    return True


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


def _priority(value: object) -> int:
    """A priority checked: an int (not a bool) from -32768 to 32767; InvalidJob otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not -32768 <= value <= 32767:
        raise InvalidJob(f"priority must be an integer from -32768 to 32767, got {value!r}")
    return value


def _available_at(value: object) -> datetime:
    """An available_at checked: a timezone-aware datetime; InvalidJob otherwise."""
    if not isinstance(value, datetime):
        raise InvalidJob(f"available_at must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJob("available_at must be timezone-aware, e.g. datetime.now(timezone.utc)")
    return value


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
