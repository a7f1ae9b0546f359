"""The slot runner: claim one job, run its handler, decide, settle. One slot, one job."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from brooq.engine.interrupts import InterruptScope
from brooq.engine.kinds import Kind, Registry
from brooq.engine.outcome import Outcome, SettleKind, decide, describe_error
from brooq.engine.store import Claimed, SettleHookFailed, Store
from brooq.vocabulary import Claim, Interrupted, KindNotRegistered, KindOptions, Lease

log = logging.getLogger("brooq.runner")


@dataclass(frozen=True, slots=True)
class Attempted:
    """What one attempt came to: the claim, the decided outcome, whether it was written."""

    claimed: Claimed
    outcome: Outcome
    written: bool
    duration_s: float


class RunListener(Protocol):
    """Receives the events of a slot (logs, metrics, the supervisor pipe)."""

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        """A job was claimed and its handler is about to start."""

    def settled(self, attempted: Attempted) -> None:
        """An attempt ended and its outcome was written (or abandoned)."""


class SlotRunner:
    """Runs jobs one at a time for ``holder``: claim → handler → settle.

    The handler runs in the calling thread (the main thread to get soft
    interrupts). Nothing here knows SQL: the store does the writing.
    """

    def __init__(
        self,
        store: Store,
        kinds: Registry,
        holder: str,
        lease: timedelta,
        topics: Sequence[str] | None = None,
        listener: RunListener | None = None,
        prefetch: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.kinds = kinds
        self.holder = holder
        self.lease = lease
        self.topics = list(topics) if topics is not None else kinds.topics()
        self.listener = listener
        self.interrupts = InterruptScope()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.limits = {t: n for t in self.topics
                       if t in kinds and (n := kinds.options(t).max_running)}
        # Settle-and-claim in one commit, when the caller wants the next job at
        # once and no topic needs the max_running lock.
        self.prefetch = prefetch if not self.limits else None
        self._next: Claimed | None = None

    @property
    def has_prefetched(self) -> bool:
        """True when a job was claimed together with the last settle and awaits its run."""
        return self._next is not None

    def run_once(self) -> Attempted | None:
        """Claim and run one job; None when no job is ready."""
        claimed, self._next = self._next, None
        if claimed is None:
            claimed = self.store.claim(self.holder, self.topics, self.lease, self.limits)
        if claimed is None:
            return None
        return self.execute(claimed)

    def execute(self, claimed: Claimed) -> Attempted:
        """Run the handler of an already claimed job and settle its outcome."""
        started = time.monotonic()
        try:
            kind = self.kinds.get(claimed.topic)
            options = self.kinds.options(claimed.topic)
        except KindNotRegistered as exc:
            return self._finish(claimed, decide(exc, claimed.attempt, self.kinds.defaults), started)
        if self.listener:
            self.listener.claimed(claimed, options)
        claim = self._make_claim(claimed, options)
        error = self._call(kind, claim, options.attempt_timeout)
        outcome = decide(error, claimed.attempt, options)
        if error is not None and outcome.kind is not SettleKind.ABANDON:
            log.warning(
                "handler failed", exc_info=error,
                extra={"job_id": claimed.id, "topic": claimed.topic, "attempt": claimed.attempt},
            )
        return self._finish(claimed, outcome, started, claim, options)

    def _make_claim(self, claimed: Claimed, options: KindOptions) -> Claim:
        timeout = options.attempt_timeout
        deadline = datetime.now(UTC) + timeout if timeout else None
        return Claim(
            id=claimed.id,
            topic=claimed.topic,
            payload=claimed.payload,
            attempt=claimed.attempt,
            lease=Lease(self.holder, claimed.locked_until),
            deadline=deadline,
            max_attempts=options.max_attempts,
        )

    def _call(self, kind: Kind, claim: Claim, timeout: timedelta | None) -> BaseException | None:
        # Everything a handler raises is its outcome, BaseException included
        # (SystemExit, KeyboardInterrupt): a handler cannot stop the worker.
        try:
            with self.interrupts.attempt(timeout):
                result = kind.handler(claim)
                if isinstance(result, Awaitable):
                    self._await(result)
        except BaseException as exc:
            return exc
        fired = self.interrupts.fired
        if fired is not None:
            # The handler swallowed the interrupt and returned: its attempt still
            # timed out, or its result still cannot be written.
            return fired(f"{fired.reason} (the handler caught the interrupt and returned)")
        return None

    def _await(self, awaitable: Awaitable[Any]) -> None:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        loop = self._loop

        async def wrapped() -> Any:
            return await awaitable

        task = loop.create_task(wrapped())
        self.interrupts.watch_task(task)
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            reason = self.interrupts.fired
            if reason is not None:
                raise reason() from None
            raise

    def _finish(
        self,
        claimed: Claimed,
        outcome: Outcome,
        started: float,
        claim: Claim | None = None,
        options: KindOptions | None = None,
    ) -> Attempted:
        outcome, written = self._settle(claimed, outcome, claim, options)
        attempted = Attempted(claimed, outcome, written, time.monotonic() - started)
        if self.listener:
            self.listener.settled(attempted)
        return attempted

    def _settle(
        self, claimed: Claimed, outcome: Outcome, claim: Claim | None, options: KindOptions | None
    ) -> tuple[Outcome, bool]:
        """Write ``outcome``; return what was finally decided and whether it was written."""
        if outcome.kind is SettleKind.ABANDON:
            return outcome, False
        plain = outcome.kind is not SettleKind.DONE or claim is None or not (
            claim.chained or claim.hooks)
        if plain and self.prefetch is not None and self.prefetch():
            written, self._next = self.store.settle_and_claim(
                claimed.ticket, outcome, self.topics, self.lease)
            return outcome, written
        if outcome.kind is not SettleKind.DONE or claim is None:
            return outcome, self.store.settle(claimed.ticket, outcome)
        try:
            return outcome, self.store.settle(claimed.ticket, outcome, claim.chained, claim.hooks)
        except SettleHookFailed as exc:
            # The hooks' transaction rolled back with the job's done: the attempt
            # failed after all; record (and report) that failure, without the hooks.
            cause = exc.__cause__ or exc
            log.warning("settle hook failed", exc_info=cause, extra={"job_id": claimed.id})
            failure = decide(cause, claimed.attempt, options or self.kinds.defaults)
            return failure, self.store.settle(claimed.ticket, failure)

    def close(self) -> None:
        """Release the event loop and the signal handlers."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self.interrupts.uninstall()


__all__ = [
    "Attempted",
    "Interrupted",
    "RunListener",
    "SettleHookFailed",
    "SlotRunner",
    "describe_error",
]
