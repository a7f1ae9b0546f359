"""The slot runner: claim one job, run it, settle it. One slot, one job, one store.

It serves ``brooq work`` and ``queue.drain()``; the supervisor's worker
processes run the same executor but get their jobs from the parent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from brooq.engine.executor import Executed, Executor
from brooq.engine.interrupts import InterruptScope
from brooq.engine.kinds import Registry
from brooq.engine.outcome import Outcome, SettleKind, decide
from brooq.engine.store import Claimed, SettleHookFailed, Store
from brooq.vocabulary import DEFAULT_MAX_RESULT_BYTES, KindOptions

log = logging.getLogger("brooq.runner")


@dataclass(frozen=True, slots=True)
class Attempted:
    """What one attempt came to: the claim, the decided outcome, whether it was written.

    ``written`` is None when the outcome was handed to someone else to write
    (a supervisor's completer) and is not known yet.
    """

    claimed: Claimed
    outcome: Outcome
    written: bool | None
    duration_s: float


class RunListener(Protocol):
    """Receives the events of a slot (logs, metrics, the supervisor pipe)."""

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        """A job was claimed and its handler is about to start."""

    def settled(self, attempted: Attempted) -> None:
        """An attempt ended and its outcome was written (or abandoned)."""


def settle_executed(store: Store, executed: Executed) -> tuple[Outcome, bool]:
    """Write what ``executed`` decided, effects included; what was written, and whether.

    When a chain or hook fails, the transaction that would have written
    ``done`` rolled back with it: the attempt failed after all, and that
    failure is recorded instead (without the effects).
    """
    outcome, claimed = executed.outcome, executed.claimed
    if outcome.kind is SettleKind.ABANDON:
        return outcome, False
    if not executed.has_effects or executed.claim is None:
        return outcome, store.settle(claimed.ticket, outcome)
    try:
        claim = executed.claim
        return outcome, store.settle(claimed.ticket, outcome, claim.chained, claim.hooks)
    except SettleHookFailed as exc:
        cause = exc.__cause__ or exc
        log.warning("settle hook failed", exc_info=cause, extra={"job_id": claimed.id})
        failure = decide(cause, claimed.attempt, executed.options)
        return failure, store.settle(claimed.ticket, failure)


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
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self.store = store
        self.kinds = kinds
        self.holder = holder
        self.lease = lease
        self.topics = list(topics) if topics is not None else kinds.topics()
        self.listener = listener
        self.executor = Executor(kinds, max_result_bytes, parents=store.parents)
        self.limits = {
            t: n for t in self.topics if t in kinds and (n := kinds.options(t).max_running)
        }
        self.rates = {t: r for t, r in kinds.rates().items() if t in self.topics}
        self.fair = {t: f for t, f in kinds.fairness().items() if t in self.topics}
        self.next_token_in: float | None = None
        """After a claim the rate limit cut short: seconds until a token comes back."""

    @property
    def interrupts(self) -> InterruptScope:
        """The executor's interrupt scope (soft timeouts, lease lost, canceled)."""
        return self.executor.interrupts

    def run_once(self) -> Attempted | None:
        """Claim and run one job; None when no job is ready."""
        batch = self.store.claim_many(
            self.holder, self.topics, self.lease, 1, self.limits, self.rates, self.fair
        )
        self.next_token_in = batch.next_token_in()
        if not batch:
            return None
        return self.execute(batch[0])

    def execute(self, claimed: Claimed) -> Attempted:
        """Run the handler of an already claimed job and settle its outcome."""
        if self.listener and claimed.topic in self.kinds:
            self.listener.claimed(claimed, self.executor.options(claimed))
        executed = self.executor.run(claimed)
        outcome, written = settle_executed(self.store, executed)
        self.executor.settled(executed, outcome, written)
        attempted = Attempted(claimed, outcome, written, time.monotonic() - executed.started)
        if self.listener:
            self.listener.settled(attempted)
        return attempted

    def close(self) -> None:
        """Release the event loop and the signal handlers."""
        self.executor.close()


__all__ = ["Attempted", "RunListener", "SlotRunner", "settle_executed"]
