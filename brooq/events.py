"""The events a slot emits, as log lines with stable names."""

from __future__ import annotations

import logging

from brooq.engine.port import Claimed
from brooq.engine.runner import Attempted
from brooq.logs import event
from brooq.vocabulary import KindOptions

log = logging.getLogger("brooq.worker")

EVENT_BY_LABEL = {
    "done": "JobDone",
    "failed": "JobFailed",
    "delayed": "JobFailed",
    "preserved": "JobFailed",
    "dead": "JobDead",
    "canceled": "JobCanceled",
    "abandoned": "LeaseLost",
}


class LoggingListener:
    """Logs JobClaimed and the outcome event of every attempt."""

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        """Log JobClaimed."""
        event(log, "JobClaimed", job_id=claimed.id, topic=claimed.topic, attempt=claimed.attempt)

    def settled(self, attempted: Attempted) -> None:
        """Log JobDone/JobFailed/JobDead/JobCanceled (or LeaseLost when nothing was written)."""
        outcome = attempted.outcome
        name = EVENT_BY_LABEL.get(outcome.label, "JobFailed")
        fields = {
            "job_id": attempted.claimed.id, "topic": attempted.claimed.topic,
            "attempt": attempted.claimed.attempt, "outcome": outcome.label,
            "duration_s": round(attempted.duration_s, 6),
        }
        if outcome.retry_in is not None:
            fields["retry_in_s"] = round(outcome.retry_in.total_seconds(), 3)
        if outcome.error and outcome.label != "done":
            fields["error"] = outcome.error
        if not attempted.written and outcome.label != "abandoned":
            name, fields["note"] = "LeaseLost", "outcome not written: the lease was lost"
        level = logging.WARNING if name in ("JobDead", "LeaseLost") else logging.INFO
        event(log, name, level, **fields)
