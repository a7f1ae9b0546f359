"""Settings of the maintenance every supervisor runs: the reaper, retention, partitions."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from brooq.config import values as v
from brooq.config.settings.key import Key, KeyTable

_MIN_REAPER_PERIOD = timedelta(seconds=5)
_AUTO_RETENTION_PERIOD = timedelta(minutes=5)
MIN_RETENTION_TTL = timedelta(minutes=1)


def _reaper_period(values: Mapping[str, Any]) -> timedelta:
    lease: timedelta = values["lease"]
    return max(_MIN_REAPER_PERIOD, lease / 4)


class MaintenanceKeys(KeyTable):
    """QUEUE_REAPER_PERIOD, QUEUE_MAX_EXPIRATIONS, the QUEUE_RETENTION_* keys and
    QUEUE_PARTITION_INTERVAL."""

    reaper_period: Key[timedelta] = Key(
        "QUEUE_REAPER_PERIOD",
        v.duration(
            zero_ok=False,
            at_least=timedelta(seconds=1),
            why=": every supervisor would run the reaper's UPDATE that often",
        ),
        None,
        "How often expired leases go back to pending (at least 1s). Empty: max(5s, lease/4).",
        section="maintenance",
        example="30s, or leave it unset for max(5s, lease/4)",
        computed=_reaper_period,
    )
    max_expirations: Key[int] = Key(
        "QUEUE_MAX_EXPIRATIONS",
        v.integer(0, 1_000_000),
        "5",
        "A job whose lease expired this many times in a row (its holder died every time it "
        "ran: it may be killing its host) is moved to dead by the reaper (0 = never).",
        section="maintenance",
        example="5, or 0 for never",
    )
    retention_ttl: Key[timedelta] = Key(
        "QUEUE_RETENTION_TTL",
        v.duration(
            zero_ok=True,
            at_least=MIN_RETENTION_TTL,
            why=": results, idempotency keys and finished parents would be deleted before "
            "anyone could read them",
        ),
        "720h",
        "Terminal rows (done, dead, canceled) older than this are deleted (at least 1m); 0 "
        "disables retention. It is also the idempotency window: a key is free again once its "
        "row is gone.",
        section="maintenance",
        example="720h, or 0 to disable retention",
    )
    retention_batch: Key[int] = Key(
        "QUEUE_RETENTION_BATCH",
        v.integer(1, 1_000_000),
        "1000",
        "Rows deleted per retention transaction.",
        section="maintenance",
    )
    retention_period: Key[timedelta] = Key(
        "QUEUE_RETENTION_PERIOD",
        v.duration(
            zero_ok=True,
            at_least=timedelta(seconds=1),
            why=": every supervisor would run retention's DELETE that often",
        ),
        "0",
        "How often retention runs (at least 1s; 0 = automatic: 5m).",
        section="maintenance",
        example="5m, or 0 for automatic",
        computed=lambda values: _AUTO_RETENTION_PERIOD,
    )
    partition_interval: Key[timedelta] = Key(
        "QUEUE_PARTITION_INTERVAL",
        v.duration(
            zero_ok=False,
            at_least=timedelta(hours=1),
            why=": every claim reads each partition's index of ready rows, so a shorter one "
            "makes the claims read hundreds of them",
        ),
        "24h",
        "The span of ids (creation times) each partition of the job table holds; the "
        "supervisors create them 3 intervals ahead. Retention drops a partition whole once "
        "its span ended more than QUEUE_RETENTION_TTL ago and all its rows are terminal and "
        "older than that.",
        section="maintenance",
        example="24h, or 1h for a queue of hundreds of millions of jobs a day",
    )
