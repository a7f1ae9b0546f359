"""The producer: claims jobs for the workers in batches and keeps them in a small buffer.

Workers that serve the same topics form a group; each group has a buffer,
refilled with one claim statement (``LIMIT n … SKIP LOCKED``) sized to the
group's idle workers plus a prefetch depth. A worker that finishes gets its
next job from the buffer at once, without waiting for the database. Jobs
wait in a buffer only briefly: past ``max_wait`` they are released,
uncharged, for another supervisor to take. A claim that a rate limit cut
short is sent again when the limit's next token is due, not before.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from brooq.engine.store import Claimed, ClaimedBatch, Store
from brooq.supervisor.database import Database
from brooq.vocabulary import Fairness, RateLimit

log = logging.getLogger("brooq.supervisor")

RATE_WINDOW_S = 0.1
"""The rate of a group is measured over windows of at least this long."""
RATE_STALE_S = 1.0
"""No job finished for this long: the workers are not turning jobs over."""
BUFFER_S = 0.1
"""The buffer holds what the workers finish in this long, at least (see Producer.depth).

A claim costs the database about 0.5 ms however few rows it takes: refilled at half,
a 100 ms buffer makes it one claim per 50 ms of work (fewer, larger claims beside
CPU-bound handlers, where 50 ms meant a claim of ~20 rows every 25 ms)."""
MAX_DEPTH = 1000
"""The most jobs ever held ahead of the idle workers of one group."""

Group = tuple[str, ...]
"""The topics a set of workers serves (sorted)."""


@dataclass
class Buffered:
    """A claimed job waiting for a worker."""

    claimed: Claimed
    since: float


@dataclass
class GroupState:
    """One group's buffer and what the producer knows of its topics."""

    topics: Group
    buffer: deque[Buffered] = field(default_factory=deque)
    asked: int = 0
    """Jobs asked for by the claim under way (0: none under way)."""
    more_ready: bool = True
    """False after a claim came back short: wait for a NOTIFY or the poll interval."""
    next_poll: float = 0.0
    last_finish: float = -1e9
    """When a worker of the group last finished a job (prefetch pays off only while they do)."""
    rate: float = 0.0
    """A moving average of how many jobs the group's workers finish a second."""
    window_start: float = 0.0
    window_count: int = 0
    round_trip: float = 0.005
    """A moving average of how long a claim takes, seconds."""
    oldest: float = float("inf")
    """No buffered job was buffered before this (a lower bound)."""


class Producer:
    """Keeps each group's buffer filled; one claim statement per refill."""

    def __init__(
        self,
        store: Store,
        db: Database,
        holder: str,
        lease: timedelta,
        groups: Sequence[Group],
        limits: Mapping[str, int],
        prefetch: int,
        poll_interval: timedelta,
        max_wait: float,
        on_claimed: Callable[[list[Claimed], float], None],
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> None:
        self.store, self.db, self.holder, self.lease = store, db, holder, lease
        self.fair = dict(fair or {})
        """The fairness of every fair topic (claimed under its claim lock, like a cap)."""
        self.groups = {g: GroupState(g) for g in groups}
        self.limits = dict(limits)
        self.rates = dict(rates or {})
        """The rate limit of every topic that has one (a reload replaces them)."""
        self.declared: dict[str, RateLimit] = {}
        """The rates last written to the database (``brooq status`` and /metrics read them)."""
        self._declare_at = 0.0
        """No declaration before this (one at a time; after a failure, a poll interval on)."""
        self.prefetch = prefetch
        self.poll_s = poll_interval.total_seconds()
        self.max_wait = max_wait
        self.on_claimed = on_claimed
        self.paused = False

    def add_group(self, group: Group) -> None:
        """Serve a group of topics (a worker slot added by TTIN)."""
        self.groups.setdefault(group, GroupState(group))

    def depth(self, state: GroupState, workers: int, now: float) -> int:
        """How many jobs to keep ahead of the group's idle workers.

        At least ``prefetch`` while the workers turn jobs over, and as many as
        they finish (at the rate measured) in BUFFER_S or two claim round trips,
        whichever is longer:
        fast handlers never wait for the database, and a claim is sent for a batch
        (the buffer is refilled once half of it is gone); none while they do not
        turn jobs over (jobs waiting behind long-running handlers would only be
        released again), nor for a group whose every topic has a rate limit: its jobs
        are claimed for workers that take them at once, so they start when they spend
        their token.
        """
        if not self.prefetch or now - state.last_finish > RATE_STALE_S:
            return 0
        if all(t in self.rates for t in state.topics):
            return 0
        covering = int(state.rate * max(state.round_trip * 2, BUFFER_S)) + 1
        return min(max(self.prefetch, covering), MAX_DEPTH)

    def wanted(self, state: GroupState, free: int, workers: int, now: float) -> int:
        """How many jobs to claim for a group whose ``workers`` would take ``free`` more now.

        None until the buffer runs low (it cannot serve the workers that wait, or
        holds half its depth or less): a claim is paid per statement, so it is
        sent for a batch, not for each job a worker finishes.
        """
        depth, held = self.depth(state, workers, now), len(state.buffer)
        if held >= free and held > depth // 2:
            return 0
        return max(0, free + depth - held)

    def run_once(
        self,
        now: float,
        free: Mapping[Group, int],
        workers: Mapping[Group, int],
        idle: Mapping[Group, int] | None = None,
    ) -> int:
        """Send a claim for every group short of jobs; how many claims were sent.

        ``idle`` (workers with nothing queued; default: as many as ``free``) bounds the
        jobs of capped topics (max_running) a claim takes: a capped job held in a
        buffer, or queued behind a running job, keeps another supervisor's idle worker
        from running it.
        """
        if self.paused:
            return 0
        idle = free if idle is None else idle
        self._declare(now)
        sent = 0
        for group, state in self.groups.items():
            if state.asked:
                continue
            want = self.wanted(state, free.get(group, 0), workers.get(group, 0), now)
            if all(t in self.limits or t in self.rates for t in group):
                want = min(want, idle.get(group, 0))
            if want <= 0 or not (state.more_ready or now >= state.next_poll):
                continue
            self._claim(state, want, idle.get(group, 0), now)
            sent += 1
        return sent

    def _declare(self, now: float) -> None:
        """Write the served rate limits into their buckets, once and after each change."""
        if self.rates == self.declared or now < self._declare_at:
            return
        rates = dict(self.rates)
        self._declare_at = float("inf")

        def done(_: object, error: BaseException | None) -> None:
            if error is None:
                self.declared, self._declare_at = rates, 0.0
            else:
                self._declare_at = now + self.poll_s

        self.db.submit("rates", lambda: self.store.declare_rates(rates), done)

    def _claim(self, state: GroupState, want: int, idle: int, now: float) -> None:
        state.asked = want
        limits = {t: self.limits[t] for t in state.topics if t in self.limits}
        rates = {t: self.rates[t] for t in state.topics if t in self.rates}
        fair = {t: self.fair[t] for t in state.topics if t in self.fair}
        limited = [t for t in state.topics if t in limits or t in rates]
        fair_only = [t for t in state.topics if t in fair and t not in limited]
        free = [t for t in state.topics if t not in limited and t not in fair]
        store, holder, lease = self.store, self.holder, self.lease

        def claim() -> list[Claimed]:
            # Jobs of capped (max_running) or rate-limited topics only for the workers
            # idle now, then fair topics (in their keys' turns) and free ones for the rest.
            out = (
                store.claim_many(holder, limited, lease, min(want, idle), limits, rates, fair)
                if limited and idle
                else ClaimedBatch()
            )
            if fair_only and len(out) < want:
                out.extend(
                    store.claim_many(holder, fair_only, lease, want - len(out), {}, {}, fair)
                )
            if free and len(out) < want:
                out.extend(store.claim_many(holder, free, lease, want - len(out), {}, {}))
            return out

        lease_end = now + self.lease.total_seconds()
        asked_at = time.monotonic()

        def done(claimed: list[Claimed] | None, error: BaseException | None) -> None:
            # The jobs wait in the buffer from when they arrive: a slow claim (a database
            # under load) must not make them stale on arrival, to be released unrun.
            arrived = now + (time.monotonic() - asked_at)
            state.asked = 0
            state.round_trip += (time.monotonic() - now - state.round_trip) / 4
            if error is not None or claimed is None:
                state.more_ready, state.next_poll = False, now + self.poll_s
                return
            state.more_ready = len(claimed) >= want
            if not state.more_ready:
                # Cut short by a rate limit: look again when its next token is due (a
                # NOTIFY alone would only meet the same empty bucket).
                token = claimed.next_token_in() if isinstance(claimed, ClaimedBatch) else None
                state.next_poll = now + (self.poll_s if token is None else min(self.poll_s, token))
            self.on_claimed(claimed, lease_end)
            state.buffer.extend(Buffered(c, arrived) for c in claimed)
            state.oldest = min(state.oldest, arrived)

        self.db.submit(f"claim:{','.join(state.topics)}", claim, done)

    def next_polls(self, now: float) -> list[float]:
        """When each group that found no more jobs looks again (the idle poll). A poll that is
        due already is no reason to wake: it waits for a worker that wants a job, and that
        worker's report wakes the loop."""
        return [
            s.next_poll
            for s in self.groups.values()
            if not s.more_ready and not s.asked and s.next_poll > now
        ]

    def heard(self, topics: set[str]) -> None:
        """New jobs were enqueued (NOTIFY): groups serving these topics (``*``: all) claim again."""
        for state in self.groups.values():
            if "*" in topics or topics & set(state.topics):
                state.more_ready = True

    def peek(self, group: Group) -> Claimed | None:
        """The job :meth:`take` would return next, left in the buffer."""
        state = self.groups.get(group)
        if state is None or not state.buffer:
            return None
        return state.buffer[0].claimed

    def take(self, group: Group) -> Claimed | None:
        """The next buffered job of ``group`` (best first), or None."""
        state = self.groups.get(group)
        if state is None or not state.buffer:
            return None
        return state.buffer.popleft().claimed

    def finished(self, group: Group, now: float) -> None:
        """A worker of ``group`` finished a job: it counts toward the group's rate."""
        state = self.groups.get(group)
        if state is None:
            return
        if now - state.last_finish > RATE_STALE_S:  # a new spell of work: measure afresh
            state.rate, state.window_start, state.window_count = 0.0, now, 0
        state.last_finish = now
        state.window_count += 1
        elapsed = now - state.window_start
        if elapsed >= RATE_WINDOW_S:
            seen = state.window_count / elapsed
            state.rate = seen if state.rate == 0.0 else state.rate + (seen - state.rate) / 2
            state.window_start, state.window_count = now, 0

    def put_back(self, group: Group, claimed: Claimed, now: float) -> None:
        """A job given back unrun by a leaving worker goes first in line again."""
        state = self.groups.setdefault(group, GroupState(group))
        state.buffer.appendleft(Buffered(claimed, now))
        state.oldest = min(state.oldest, now)

    def drop(self, job_id: str) -> Claimed | None:
        """Remove a buffered job (canceled, or its lease lost); what was removed."""
        for state in self.groups.values():
            for item in state.buffer:
                if item.claimed.id == job_id:
                    state.buffer.remove(item)
                    return item.claimed
        return None

    def take_topics(self, topics: frozenset[str]) -> list[Claimed]:
        """Remove and return the buffered jobs of ``topics`` (paused)."""
        out: list[Claimed] = []
        if not topics:
            return out
        for state in self.groups.values():
            if not topics.intersection(state.topics) or not state.buffer:
                continue
            out += [b.claimed for b in state.buffer if b.claimed.topic in topics]
            state.buffer = deque(b for b in state.buffer if b.claimed.topic not in topics)
            state.oldest = min((b.since for b in state.buffer), default=float("inf"))
        return out

    def stale(self, now: float) -> list[Claimed]:
        """Remove and return the jobs that waited in a buffer longer than ``max_wait``."""
        out: list[Claimed] = []
        for state in self.groups.values():
            if not state.buffer or now - state.oldest <= self.max_wait:
                continue  # every tick asks: spare it a walk over every buffered job
            out += [b.claimed for b in state.buffer if now - b.since > self.max_wait]
            state.buffer = deque(b for b in state.buffer if now - b.since <= self.max_wait)
            state.oldest = min((b.since for b in state.buffer), default=float("inf"))
        return out

    def drain(self) -> list[Claimed]:
        """Empty every buffer (stopping); the jobs removed."""
        out = [b.claimed for state in self.groups.values() for b in state.buffer]
        for state in self.groups.values():
            state.buffer.clear()
        return out

    def buffered(self) -> Iterator[Claimed]:
        """Every buffered job."""
        for state in self.groups.values():
            for item in state.buffer:
                yield item.claimed

    def claiming(self) -> bool:
        """True while a claim is under way."""
        return any(state.asked for state in self.groups.values())
