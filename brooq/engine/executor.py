"""The executor: run the handler of a claimed job and decide its outcome. No store, no I/O.

Used where a job runs: the supervisor's worker processes and the in-process
slot runner (``brooq work``, ``queue.drain()``). What a handler raises, or a
payload Python cannot decode, becomes an Outcome through one decision
(:func:`brooq.engine.outcome.decide`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq.engine.interrupts import InterruptScope
from brooq.engine.kinds import Kind, Registry
from brooq.engine.middleware import settled_of
from brooq.engine.outcome import Outcome, SettleKind, WorkerCrashed, decide, describe_error
from brooq.engine.store import Claimed, PayloadUndecodable
from brooq.vocabulary import (
    DEFAULT_MAX_RESULT_BYTES,
    Claim,
    KindNotRegistered,
    KindOptions,
    Lease,
    Parent,
    ResultNotJSON,
    ResultTooLarge,
    encode_result,
)

ParentsOf = Callable[[str], Mapping[str, Parent]]
"""Reads a job's parents from a store (``Store.parents``)."""

log = logging.getLogger("brooq.runner")


@dataclass(frozen=True, slots=True)
class Executed:
    """A handler's run: the decided outcome, and the Claim holding its chain and hooks."""

    claimed: Claimed
    outcome: Outcome
    options: KindOptions
    claim: Claim | None
    started: float
    """``time.monotonic()`` when the run began."""
    error: BaseException | None = None
    """What the attempt raised (the handler or a middleware), or None."""

    @property
    def has_effects(self) -> bool:
        """True when a DONE must be written with chained jobs or hooks, in one transaction."""
        return (
            self.outcome.kind is SettleKind.DONE
            and self.claim is not None
            and bool(self.claim.chained or self.claim.hooks)
        )


def _trace_context(text: str | None) -> dict[str, str] | None:
    """A claimed job's trace context, decoded (None when it has none, or it is not an
    object of texts: a row written by hand must not fail the job)."""
    if text is None:
        return None
    try:
        decoded = json.loads(text)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    return {str(k): str(v) for k, v in decoded.items()}


def crashed(kinds: Registry, claimed: Claimed, outcome: Outcome, started: float | None) -> None:
    """Tell the middleware of an attempt whose worker process died or was killed: in the
    supervisor, which recorded ``outcome`` (the attempt began at ``started``, monotonic)."""
    stack = kinds.middleware
    if not stack.by_hook["settled"]:
        return
    options = kinds.job_options(claimed.topic, claimed.overrides)
    try:
        payload = claimed.payload
    except PayloadUndecodable:
        payload = None
    claim = Claim(
        id=claimed.id,
        topic=claimed.topic,
        payload=payload,
        attempt=claimed.attempt,
        lease=Lease(claimed.ticket.holder, claimed.locked_until),
        max_attempts=options.max_attempts,
        expirations=claimed.expirations,
        trace_context=_trace_context(claimed.trace_context),
    )
    error = WorkerCrashed(outcome.error or "the worker process died")
    began = time.monotonic() if started is None else started
    stack.settled(
        claim, settled_of(outcome.label, outcome.state, error, outcome.retry_in, None, began)
    )


class SettleFailed(Exception):
    """The settle transaction of a done attempt failed (a chain or on_succeeded hook)."""


class Executor:
    """Runs handlers in the calling thread (the main thread gets soft interrupts).

    ``parents`` reads a job's parents for ``claim.parents``, only when a handler asks
    (a job without parents, or a handler that never looks, costs no query).
    """

    def __init__(
        self,
        kinds: Registry,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        parents: ParentsOf | None = None,
    ) -> None:
        self.kinds = kinds
        self.max_result_bytes = max_result_bytes
        self.parents = parents
        self.interrupts = InterruptScope()
        self._loop: asyncio.AbstractEventLoop | None = None

    def options(self, claimed: Claimed) -> KindOptions:
        """The complete options of a claimed job: its kind's (the defaults for a topic with
        no handler), with the overrides the job carries."""
        return self.kinds.job_options(claimed.topic, claimed.overrides)

    def run(self, claimed: Claimed) -> Executed:
        """Decode the payload, call the handler, decide; never raises for the job's faults."""
        started = time.monotonic()
        options = self.options(claimed)
        try:
            kind = self.kinds.get(claimed.topic)
            payload = claimed.payload
        except KindNotRegistered as exc:
            outcome = decide(exc, claimed.attempt, options)
            return Executed(claimed, outcome, options, None, started, exc)
        except PayloadUndecodable as exc:
            # Running it again cannot help: the same bytes fail the same way.
            dead = Outcome(SettleKind.DEAD, "dead", error=describe_error(exc))
            return Executed(claimed, dead, options, None, started, exc)
        claim = self._claim(claimed, payload, options)
        error, result = self._call(kind, claim, options.attempt_timeout)
        if error is None:
            try:
                result = encode_result(result, self.max_result_bytes)
            except (ResultNotJSON, ResultTooLarge) as exc:
                error = exc  # the attempt failed: retried like any exception
        outcome = decide(error, claimed.attempt, options)
        if error is None and result is not None:
            outcome = replace(outcome, result=result)
        if error is not None and outcome.kind is not SettleKind.ABANDON:
            log.warning(
                "handler failed",
                exc_info=error,
                extra={"job_id": claimed.id, "topic": claimed.topic, "attempt": claimed.attempt},
            )
        return Executed(claimed, outcome, options, claim, started, error)

    def settled(self, executed: Executed, outcome: Outcome, written: bool | None) -> None:
        """Tell the middleware how the attempt ended (``outcome`` as written: a settle with
        effects may have turned done into a failure); nothing when none listens."""
        stack = self.kinds.middleware
        if not stack.by_hook["settled"] or executed.claim is None:
            return
        error = executed.error
        if outcome is not executed.outcome and error is None:
            error = SettleFailed(outcome.error or "the settle transaction failed")
        stack.settled(
            executed.claim,
            settled_of(
                outcome.label,
                outcome.state,
                error,
                outcome.retry_in,
                written,
                executed.started,
            ),
        )

    def _claim(self, claimed: Claimed, payload: Any, options: KindOptions) -> Claim:
        timeout = options.attempt_timeout
        return Claim(
            id=claimed.id,
            topic=claimed.topic,
            payload=payload,
            attempt=claimed.attempt,
            lease=Lease(claimed.ticket.holder, claimed.locked_until),
            deadline=datetime.now(UTC) + timeout if timeout else None,
            max_attempts=options.max_attempts,
            expirations=claimed.expirations,
            trace_context=_trace_context(claimed.trace_context),
            _read_parents=functools.partial(self.parents, claimed.id) if self.parents else None,
        )

    def _call(
        self, kind: Kind, claim: Claim, timeout: timedelta | None
    ) -> tuple[BaseException | None, Any]:
        """What the handler raised (None when it returned), and what it returned."""
        # Everything a handler raises is its outcome, BaseException included
        # (SystemExit, KeyboardInterrupt): a handler cannot stop the worker.
        try:
            with self.interrupts.attempt(timeout):
                if self.kinds.middleware:
                    result = self._through_middleware(kind, claim)
                else:
                    result = kind.handler(claim)
                    if isinstance(result, Awaitable):
                        result = self._await(result)
        except BaseException as exc:
            return exc, None
        fired = self.interrupts.fired
        if fired is not None:
            # The handler swallowed the interrupt and returned: its attempt still
            # timed out, or its result still cannot be written.
            return fired(f"{fired.reason} (the handler caught the interrupt and returned)"), None
        return None, result

    def _through_middleware(self, kind: Kind, claim: Claim) -> Any:
        """The handler's run inside every ``run`` hook (and, for an async handler, inside
        every ``run_async`` hook, in its event loop)."""
        stack = self.kinds.middleware

        def handler(c: Claim) -> Any:
            if stack.by_hook["run_async"] and kind.is_async:
                return self._await(stack.run_async(c, kind.handler))
            result = kind.handler(c)
            return self._await(result) if isinstance(result, Awaitable) else result

        return stack.run(claim, handler) if stack.by_hook["run"] else handler(claim)

    def _await(self, awaitable: Awaitable[Any]) -> Any:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        loop = self._loop

        async def wrapped() -> Any:
            return await awaitable

        task = loop.create_task(wrapped())
        self.interrupts.watch_task(task)
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            reason = self.interrupts.fired
            if reason is not None:
                raise reason() from None
            raise

    def close(self) -> None:
        """Release the event loop and the signal handlers."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self.interrupts.uninstall()
