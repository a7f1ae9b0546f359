"""Per-kind options: attempts, timeouts, backoff and limits, set in code, not in a column."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from brooq.vocabulary.durations import coerce_duration, format_duration
from brooq.vocabulary.errors import InvalidKindOptions
from brooq.vocabulary.fairness import Fairness, parse_fairness
from brooq.vocabulary.ratelimit import RateLimit, parse_rate_limit

MAX_ATTEMPTS = 1_000_000
"""The most attempts a kind may allow (QUEUE_MAX_ATTEMPTS has the same bound)."""
MAX_RUNNING = 2**31 - 1
"""The largest ``max_running``: the claim compares it with a PostgreSQL integer."""

JOB_OVERRIDES = (
    "max_attempts",
    "attempt_timeout",
    "max_execution_timeout",
    "backoff_base",
    "backoff_max",
)
"""The kind options one job may override for itself (``Job(max_attempts=…)``)."""

_DURATION_FIELDS = (
    "attempt_timeout",
    "max_execution_timeout",
    "backoff_base",
    "backoff_max",
    "watchdog_grace",
)


DurationLike = timedelta | int | float | str
"""A duration as KindOptions accepts it: a timedelta, seconds, or a string with units."""


@dataclass(frozen=True, slots=True)
class KindOptions:
    """Options of one kind of job. A field left None takes the configured default.

    ``max_running`` caps how many jobs of the topic are ``processing`` at once
    across every supervisor and host (None: no cap); the claim enforces it in
    the database. ``rate_limit`` (``"100/s"``, ``"30/m"``, ``"5/h"``) caps how
    many of its jobs start per interval across every supervisor and host, at
    most ``rate_burst`` at once (default: one interval's worth); it holds
    the parsed :class:`RateLimit` (burst included). A job's ``rate_key``
    gives each key a limit of its own. ``fairness="round_robin"`` makes the keys
    (``rate_key``) take turns within a priority, ``fair_weights`` (``{"key": n}``) jobs
    per turn for some (brooq.vocabulary.fairness); it holds the parsed :class:`Fairness`.

    Durations accept a timedelta, a number of seconds or a string with units
    (``"1m"``). Invalid values raise :class:`InvalidKindOptions` listing every
    problem.
    """

    max_attempts: int | None = None
    attempt_timeout: timedelta | None = None
    max_execution_timeout: timedelta | None = None
    backoff_base: timedelta | None = None
    backoff_max: timedelta | None = None
    watchdog_grace: timedelta | None = None
    max_running: int | None = None
    rate_limit: RateLimit | None = None
    rate_burst: int | None = None
    fairness: Fairness | None = None
    fair_weights: tuple[tuple[str, int], ...] | None = None

    if TYPE_CHECKING:  # what the constructor accepts; the fields always hold timedeltas

        def __init__(
            self,
            max_attempts: int | None = None,
            attempt_timeout: DurationLike | None = None,
            max_execution_timeout: DurationLike | None = None,
            backoff_base: DurationLike | None = None,
            backoff_max: DurationLike | None = None,
            watchdog_grace: DurationLike | None = None,
            max_running: int | None = None,
            rate_limit: str | RateLimit | None = None,
            rate_burst: int | None = None,
            fairness: str | Fairness | None = None,
            fair_weights: Mapping[str, int] | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in _DURATION_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            try:
                coerced = coerce_duration(value, name=name)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if coerced <= timedelta(0):
                problems.append(
                    f"{name}: must be greater than zero, got {format_duration(coerced)}"
                )
            object.__setattr__(self, name, coerced)
        for name, most in (("max_attempts", MAX_ATTEMPTS), ("max_running", MAX_RUNNING)):
            problem = _positive_int_problem(name, getattr(self, name), most)
            if problem:
                problems.append(problem)
        problems.extend(self._rate_problems())
        problems.extend(self._fairness_problems())
        if not problems:
            problems.extend(self._order_problems())
        if problems:
            raise InvalidKindOptions("; ".join(problems))

    def _rate_problems(self) -> list[str]:
        if self.rate_limit is None:
            if self.rate_burst is not None:
                return [
                    f'rate_burst: needs a rate_limit (such as "100/s"), got only '
                    f"rate_burst={self.rate_burst!r}"
                ]
            return []
        rate, problems = parse_rate_limit(self.rate_limit, self.rate_burst)
        if rate is not None:
            object.__setattr__(self, "rate_limit", rate)
        return problems

    def _fairness_problems(self) -> list[str]:
        fairness, problems = parse_fairness(self.fairness, self.fair_weights)
        if fairness is not None:
            object.__setattr__(self, "fairness", fairness)
            object.__setattr__(self, "fair_weights", fairness.weights or None)
        return problems

    def _order_problems(self) -> list[str]:
        out = []
        soft, hard = self.attempt_timeout, self.max_execution_timeout
        if soft is not None and hard is not None and soft > hard:
            out.append(
                f"attempt_timeout ({format_duration(soft)}) must not exceed "
                f"max_execution_timeout ({format_duration(hard)})"
            )
        base, top = self.backoff_base, self.backoff_max
        if base is not None and top is not None and base > top:
            out.append(
                f"backoff_base ({format_duration(base)}) must not exceed "
                f"backoff_max ({format_duration(top)})"
            )
        return out

    def overridden_by(self, overrides: KindOptions | None) -> KindOptions:
        """These options with every field ``overrides`` sets taken from it (one job's own).

        Each override was checked on its own when its job was made; the result is not
        checked again against the fields it keeps, so a job's ``attempt_timeout`` above
        its kind's ``max_execution_timeout`` stands (the hard limit then comes first)
        and a worker never fails on a combination.
        """
        if overrides is None:
            return self
        merged = object.__new__(KindOptions)
        for name in self.__slots__:
            value = getattr(overrides, name) if name in JOB_OVERRIDES else None
            object.__setattr__(merged, name, getattr(self, name) if value is None else value)
        return merged

    def with_defaults(self, defaults: KindOptions) -> KindOptions:
        """Fill every unset field from ``defaults``; the result is checked again."""
        filled = {
            f.name: getattr(defaults, f.name) for f in fields(self) if getattr(self, f.name) is None
        }
        if self.rate_limit is not None:
            filled.pop("rate_burst", None)  # a kind's own rate keeps its own burst
        if self.fairness is not None:
            filled.pop("fair_weights", None)  # a kind's own fairness keeps its own weights
        return replace(self, **filled)


def job_overrides(**given: object) -> KindOptions | None:
    """The overrides one job carries, checked as kind options are (None: it sets none).

    ``given`` holds the JOB_OVERRIDES fields (None: unset). A bad value raises
    InvalidKindOptions with the message a kind's option gets.
    """
    if all(value is None for value in given.values()):
        return None
    return KindOptions(**given)  # type: ignore[arg-type]  # checked there, whatever the type


def stored_overrides(values: Sequence[object]) -> KindOptions | None:
    """The overrides of a stored job, from its JOB_OVERRIDES values in that order (None:
    it has none). They were checked when the job was made: they are taken as they are."""
    if all(value is None for value in values):
        return None
    options = KindOptions()
    for name, value in zip(JOB_OVERRIDES, values, strict=True):
        object.__setattr__(options, name, value)
    return options


def _positive_int_problem(name: str, value: object, most: int) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}: must be an integer, got {value!r}"
    if value < 1:
        return f"{name}: must be at least 1, got {value}"
    if value > most:
        return f"{name}: must be at most {most:,}, got {value:,}"
    return None


BUILTIN_KIND_DEFAULTS = KindOptions(
    max_attempts=5,
    attempt_timeout=timedelta(minutes=1),
    max_execution_timeout=timedelta(minutes=5),
    backoff_base=timedelta(seconds=1),
    backoff_max=timedelta(minutes=1),
)
