"""Defaults of the kind options (attempts, timeouts, backoff) that a kind's code leaves out."""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from brooq.config import values as v
from brooq.config.settings.key import Key, KeyTable
from brooq.vocabulary.options import MAX_ATTEMPTS


class KindDefaults(TypedDict):
    """Per-kind options that apply when a ``@queue.kind(...)`` call leaves them out."""

    max_attempts: int
    attempt_timeout: timedelta
    max_execution_timeout: timedelta
    backoff_base: timedelta
    backoff_max: timedelta


class KindKeys(KeyTable):
    """QUEUE_ATTEMPT_TIMEOUT, QUEUE_MAX_EXECUTION_TIMEOUT, the backoff and QUEUE_MAX_ATTEMPTS."""

    attempt_timeout: Key[timedelta] = Key(
        "QUEUE_ATTEMPT_TIMEOUT",
        v.duration(zero_ok=False),
        "1m",
        "Soft timeout of an attempt: brooq.AttemptTimedOut is raised in the handler.",
        section="kinds",
    )
    max_execution_timeout: Key[timedelta] = Key(
        "QUEUE_MAX_EXECUTION_TIMEOUT",
        v.duration(zero_ok=False),
        "5m",
        "Hard limit of an attempt: the supervisor SIGKILLs the worker (a recorded failure).",
        section="kinds",
    )
    backoff_base: Key[timedelta] = Key(
        "QUEUE_BACKOFF_BASE",
        v.duration(zero_ok=False),
        "1s",
        "Retry backoff: d = min(base * 2^(attempt-1), max), the delay uniform in [d/2, d].",
        section="kinds",
    )
    backoff_max: Key[timedelta] = Key(
        "QUEUE_BACKOFF_MAX",
        v.duration(zero_ok=False),
        "1m",
        "The longest retry backoff (and the longest brooq.Delay).",
        section="kinds",
    )
    max_attempts: Key[int] = Key(
        "QUEUE_MAX_ATTEMPTS",
        v.integer(1, MAX_ATTEMPTS),
        "5",
        "Charged attempts (lease expiries do not count) before a failing job goes dead.",
        section="kinds",
    )

    def kind_defaults(self) -> KindDefaults:
        """The kind options the settings hold, by name."""
        return KindDefaults(
            max_attempts=self.max_attempts,
            attempt_timeout=self.attempt_timeout,
            max_execution_timeout=self.max_execution_timeout,
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
        )
