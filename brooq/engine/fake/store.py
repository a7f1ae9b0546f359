"""The in-memory Store: enqueue, claim and settle with the PostgreSQL store's semantics.

The same contract tests and state machine run against this fake and the real
store, so what passes here is known to hold there. Where the fake cannot
behave like PostgreSQL it fails loudly instead of pretending: it cannot join
a caller's transaction (``enqueue(conn=…)``), and settle hooks get a
:class:`RecordingConnection` that records each statement instead of running
it. Time comes from an injectable clock, so tests can expire leases without
sleeping.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from brooq.engine.edges import enqueued_twice
from brooq.engine.fake.recording import RecordingConnection
from brooq.engine.fake.upkeep import FakeUpkeep
from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.rotation import Turn
from brooq.engine.store import Claimed, ClaimedBatch, SettleHookFailed, Ticket
from brooq.vocabulary import (
    CLAIMABLE_STATES,
    TERMINAL_STATES,
    Enqueued,
    Fairness,
    Job,
    JobRecord,
    NeedsDatabase,
    Node,
    RateLimit,
    SettleHook,
    State,
    TopicPause,
    Workflow,
    new_job_ids,
    pause_request,
)


class InMemoryStore(FakeUpkeep):
    """A thread-safe in-memory implementation of the Store port."""

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs, deduplicating per (topic, idempotency_key).

        ``conn`` is refused: the fake has no transaction of yours to join, and
        silently committing would hide a rollback your code relies on.
        """
        if conn is not None:
            raise NeedsDatabase(
                "the in-memory store cannot enqueue inside your database transaction "
                "(conn=...); test that path against PostgreSQL (brooq.Queue(dsn)), or enqueue "
                "without conn= here"
            )
        with self._lock:
            return self._enqueue_jobs(jobs)

    def _enqueue_jobs(self, jobs: Sequence[Job]) -> list[Enqueued]:
        if any(job.after_ids for job in jobs):
            ids = new_job_ids(len(jobs))
            nodes = [Node(i, job, job.after_ids) for i, job in zip(ids, jobs, strict=True)]
            return self._enqueue_graph(nodes, None)
        return [self._enqueue_one(job) for job in jobs]

    def enqueue_workflow(self, workflow: Workflow, conn: Any = None) -> list[Enqueued]:
        """Write every job of ``workflow`` at once; one Enqueued per job, in the order added.

        ``conn`` is refused, as for :meth:`enqueue_many`.
        """
        if conn is not None:
            self.enqueue_many([], conn)  # raises NeedsDatabase
        nodes = workflow.nodes()
        with self._lock:
            if any(n.id in self.rows for n in nodes):
                raise enqueued_twice(workflow.id)
            written = self._enqueue_graph(nodes, workflow.id)
            done = dict(zip([n.id for n in nodes], written, strict=True))
            return [done[h.id] for h in workflow]

    async def enqueue_many_async(self, jobs: Sequence[Job], conn: Any) -> list[Enqueued]:
        """Refused: the in-memory store has no asyncio transaction to join."""
        raise NeedsDatabase(
            "the in-memory store cannot enqueue on an asyncio connection (enqueue_async); "
            "test that path against PostgreSQL (brooq.Queue(dsn))"
        )

    def claim(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> Claimed | None:
        """Take the ready row of ``topics`` first by (priority desc, available_at, id)."""
        claimed = self.claim_many(holder, topics, lease, 1, limits, rates, fair)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> ClaimedBatch:
        """Take up to ``limit`` ready rows of ``topics`` that are not paused, best first,
        within ``limits`` and the ``rates``' buckets (on the store's clock), the keys of
        ``fair`` topics in turn."""
        with self._lock:
            topics = [t for t in topics if t not in self.paused]
            now, limits = self.now(), limits or {}
            rates = {t: r for t, r in (rates or {}).items() if t in topics}
            running = Counter(r.topic for r in self.rows.values() if r.state is State.PROCESSING)
            ready = sorted(
                (
                    r
                    for r in self.rows.values()
                    if r.state in CLAIMABLE_STATES
                    and r.available_at <= now
                    and r.topic in topics
                    and r.app_version in (None, self.app_version)
                ),
                key=lambda r: (-r.priority, r.available_at, r.id),
            )
            placed: dict[str, tuple[int, Turn]] = {}
            if fair:
                ready, placed = self.turns.order(ready, fair)
            tokens = {
                (r.topic, r.rate_key or ""): self.buckets.tokens(
                    (r.topic, r.rate_key or ""), rates[r.topic], now
                )
                for r in ready
                if r.topic in rates
            }
            out = ClaimedBatch()
            for row in ready:
                if len(out) >= limit:
                    break
                if row.topic in limits and running[row.topic] >= limits[row.topic]:
                    continue
                at = (row.topic, row.rate_key or "")
                if at in tokens:
                    if tokens[at] <= 0:
                        continue
                    tokens[at] -= 1
                running[row.topic] += 1
                out.append(self._take(row, holder, lease, now))
            if fair:  # returned in claim order, as PostgreSQL's RETURNING gives them
                self.turns.served([self.rows[c.id] for c in out], placed)
                out.sort(key=lambda c: (-c.priority, c.available_at, c.id))
            self._spend(out, rates, now)
            if len(out) < limit:
                self._note_waits(out, ready, rates, now)
            return out

    def _spend(self, out: ClaimedBatch, rates: Mapping[str, RateLimit], now: datetime) -> None:
        used = Counter((c.topic, self.rows[c.id].rate_key or "") for c in out if c.topic in rates)
        for topic in rates:
            used.setdefault((topic, ""), 0)  # the topic's own bucket records its limit
        for at, n in used.items():
            self.buckets.spend(at, rates[at[0]], n, now)
        for topic in rates:
            self.buckets.drop_idle(topic, now, [k for t, k in used if t == topic])

    def _note_waits(
        self,
        out: ClaimedBatch,
        ready: list[JobRecord],
        rates: Mapping[str, RateLimit],
        now: datetime,
    ) -> None:
        """The topics whose buckets ran dry with ready rows left, and when a token comes."""
        taken = {c.id for c in out}
        for row in ready:
            if row.topic not in rates or row.id in taken:
                continue
            at, rate = (row.topic, row.rate_key or ""), rates[row.topic]
            if self.buckets.tokens(at, rate, now) < 1:
                wait = self.buckets.wait_s(at, rate, now)
                out.rate_limited[row.topic] = min(out.rate_limited.get(row.topic, wait), wait)

    def _take(self, row: JobRecord, holder: str, lease: timedelta, now: datetime) -> Claimed:
        row = replace(
            row,
            state=State.PROCESSING,
            locked_by=holder,
            locked_until=now + lease,
            attempts=row.attempts + 1,
            updated_at=now,
        )
        self.rows[row.id] = row
        return Claimed(
            Ticket(row.id, holder, row.attempts),
            row.topic,
            json.dumps(row.payload, ensure_ascii=False),
            now + lease,
            row.expirations,
            row.priority,
            row.available_at,
            row.overrides,
            None if row.trace_context is None else json.dumps(row.trace_context),
        )

    def pause(self, topic: str, reason: str | None = None, by: str | None = None) -> TopicPause:
        """Pause ``topic`` (as the PostgreSQL store: the first ``paused_at`` is kept)."""
        checked, reason = pause_request(topic, reason)
        with self._lock:
            was = self.paused.get(checked)
            pause = TopicPause(
                str(checked), reason, was.paused_at if was else self.now(), by or "brooq"
            )
            self.paused[str(checked)] = pause
            return pause

    def resume(self, topic: str) -> TopicPause | None:
        """Lift the pause of ``topic``; the pause lifted, or None."""
        checked, _ = pause_request(topic, None)
        with self._lock:
            return self.paused.pop(str(checked), None)

    def pauses(self) -> list[TopicPause]:
        """Every paused topic, by name."""
        with self._lock:
            return [self.paused[t] for t in sorted(self.paused)]

    def declare_rates(self, rates: Mapping[str, RateLimit]) -> None:
        """Record each topic's rate limit in its bucket (created full), tokens untouched."""
        with self._lock:
            for topic, rate in rates.items():
                self.buckets.declare((topic, ""), rate, self.now())

    def settle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        chain: Sequence[Job] = (),
        hooks: Sequence[SettleHook] = (),
    ) -> bool:
        """Write the outcome if the ticket still holds the row."""
        with self._lock:
            row = self._held(ticket)
            if row is None or outcome.kind is SettleKind.ABANDON:
                return False
            now = self.now()  # the transaction's now(): its chained jobs come after it
            if outcome.kind is SettleKind.DONE:
                self._run_hooks(chain, hooks)
            self.rows[row.id] = self._settled(row, outcome, now)
            if outcome.state in TERMINAL_STATES:
                self._resolve([(row.id, str(outcome.state))], now)
            self._ended_some()
            return True

    def _settled(self, row: JobRecord, outcome: Outcome, now: datetime) -> JobRecord:
        changes: dict[str, Any] = {"state": outcome.state, "updated_at": now, "expiry_streak": 0}
        if outcome.error is not None:
            changes["last_error"] = outcome.error
            changes["last_traceback"] = outcome.traceback
        if outcome.refund_attempt:
            changes["attempts"] = max(row.attempts - 1, row.expirations)
        if outcome.kind is SettleKind.FAILED:
            changes["available_at"] = now + (outcome.retry_in or timedelta(0))
        if outcome.kind is SettleKind.DONE:
            changes["result"] = None if outcome.result is None else json.loads(outcome.result)
        return replace(row, **changes)

    def settle_many(self, settles: Sequence[tuple[Ticket, Outcome]]) -> set[str]:
        """Write plain outcomes; the ids of the rows still held (and now written)."""
        with self._lock:
            written, now = set(), self.now()  # one statement: one now() for every row
            ended = []
            for ticket, outcome in settles:
                row = self._held(ticket)
                if row is not None and outcome.kind is not SettleKind.ABANDON:
                    self.rows[row.id] = self._settled(row, outcome, now)
                    written.add(row.id)
                    if outcome.state in TERMINAL_STATES:
                        ended.append((row.id, str(outcome.state)))
            self._resolve(ended, now)
            if written:
                self._ended_some()
            return written

    def _run_hooks(self, chain: Sequence[Job], hooks: Sequence[SettleHook]) -> None:
        conn = RecordingConnection()
        saved = dict(self.rows)
        edges = {child: dict(parents) for child, parents in self.edges.items()}
        children = {parent: set(kids) for parent, kids in self.children.items()}
        try:
            self._enqueue_jobs(chain)
            for hook in hooks:
                conn.hook = f"settle hook {getattr(hook, '__qualname__', None) or repr(hook)}"
                hook(conn)
        except BaseException as exc:
            # Like the real transaction: any exception rolls back what the hooks wrote.
            self.rows, self.edges, self.children = saved, edges, children
            if isinstance(exc, NeedsDatabase) or not isinstance(exc, Exception):
                raise  # the test, not the job, is at fault: fail it loudly
            raise SettleHookFailed(f"{type(exc).__name__}: {exc}") from exc
        self.executed.extend(conn.executed)

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend the leases still held by their tickets."""
        with self._lock:
            kept = set()
            for ticket in tickets:
                row = self._held(ticket)
                if row is not None:
                    self.rows[row.id] = replace(row, locked_until=self.now() + lease)
                    kept.add(row.id)
            return kept

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held rows to pending and give back their attempt."""
        with self._lock:
            now = self.now()  # one statement in PostgreSQL: one now() for every row
            return self._give_back([row for t in tickets if (row := self._held(t))], now)

    def release_unknown(self, holder: str, known: Sequence[str]) -> set[str]:
        """Give back every row ``holder`` holds that is not in ``known``."""
        with self._lock:
            keep, now = set(known), self.now()
            return self._give_back(
                [
                    row
                    for row in self.rows.values()
                    if row.state is State.PROCESSING
                    and row.locked_by == holder
                    and row.id not in keep
                ],
                now,
            )
