"""The in-memory store's rate limit buckets: the arithmetic of the PostgreSQL claim, in Python.

A bucket is the time it is full again (GCRA); it holds ``burst - ceil(deficit
* rate / per)`` tokens, the deficit being how far that time is ahead of now,
in whole microseconds. Spending ``n`` tokens moves it to ``max(full_at, now)
+ ceil(n * per / rate)``; a refund moves it back by the time of the tokens,
rounded down. A missing bucket is full; buckets of keys are dropped once full.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from brooq.vocabulary import RateLimit

MICROSECOND = timedelta(microseconds=1)

BucketKey = tuple[str, str]
"""(topic, key); the key is ``""`` for the topic's own bucket (jobs without a rate_key)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Bucket:
    """One bucket: when it is full again, and the limit it was last spent under."""

    full_at: datetime
    rate: RateLimit


class Buckets:
    """Every bucket of the in-memory store, by (topic, key)."""

    def __init__(self) -> None:
        self.buckets: dict[BucketKey, Bucket] = {}

    def deficit_us(self, at: BucketKey, now: datetime) -> int:
        """How far the bucket is from full, in microseconds (0 when full or missing)."""
        bucket = self.buckets.get(at)
        if bucket is None or bucket.full_at <= now:
            return 0
        return (bucket.full_at - now) // MICROSECOND

    def tokens(self, at: BucketKey, rate: RateLimit, now: datetime) -> int:
        """Whole tokens the bucket holds at ``now`` under ``rate``."""
        owed = _ceil_div(self.deficit_us(at, now) * rate.count, rate.interval_us)
        return max(0, rate.burst - owed)

    def spend(self, at: BucketKey, rate: RateLimit, n: int, now: datetime) -> None:
        """Take ``n`` tokens (0 records the limit and keeps the topic's bucket)."""
        bucket = self.buckets.get(at)
        start = now if bucket is None else max(bucket.full_at, now)
        cost = _ceil_div(n * rate.interval_us, rate.count)
        self.buckets[at] = Bucket(start + cost * MICROSECOND, rate)

    def declare(self, at: BucketKey, rate: RateLimit, now: datetime) -> None:
        """Record ``rate`` in the bucket (created full when missing); tokens untouched."""
        bucket = self.buckets.get(at)
        if bucket is None:
            self.buckets[at] = Bucket(now, rate)
        else:
            bucket.rate = rate

    def refund(self, at: BucketKey, n: int, now: datetime) -> None:
        """Give ``n`` tokens back (a full or missing bucket stays full)."""
        bucket = self.buckets.get(at)
        if bucket is None or bucket.full_at <= now:
            return
        back = n * bucket.rate.interval_us // bucket.rate.count
        bucket.full_at -= back * MICROSECOND

    def wait_s(self, at: BucketKey, rate: RateLimit, now: datetime) -> float:
        """Seconds until the bucket holds a token again (0 when it holds one)."""
        reach = (rate.burst - 1) * rate.interval_us // rate.count
        return max(0, self.deficit_us(at, now) - reach) / 1e6

    def drop_idle(self, topic: str, now: datetime, keep: Iterable[str]) -> None:
        """Forget the full buckets of ``topic``'s keys (the topic's own bucket stays)."""
        kept = set(keep)
        for at, bucket in list(self.buckets.items()):
            if at[0] == topic and at[1] and at[1] not in kept and bucket.full_at <= now:
                del self.buckets[at]
