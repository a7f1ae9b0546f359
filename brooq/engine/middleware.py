"""Middleware: one place to wrap every enqueue and every run of a handler.

A middleware is an object with any of the hooks of :class:`Middleware`; each
wrapping hook gets the value in hand and ``call_next``, and returns what
``call_next`` returned (or raises). The first middleware registered is the
outermost. A stack keeps, per hook, only the middleware that define it, so a
hook no middleware defines costs nothing, and no middleware at all costs one
test per job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq.vocabulary import Claim, Enqueued, Job, State

log = logging.getLogger("brooq.middleware")

EnqueueNext = Callable[[list[Job]], list[Enqueued]]
"""What an ``enqueue`` hook calls to go on: the next middleware, then the write."""
AsyncEnqueueNext = Callable[[list[Job]], Awaitable[list[Enqueued]]]
"""What an ``enqueue_async`` hook awaits to go on."""
RunNext = Callable[[Claim], Any]
"""What a ``run`` hook calls to go on: the next middleware, then the handler."""
AsyncRunNext = Callable[[Claim], Awaitable[Any]]
"""What a ``run_async`` hook awaits to go on (async handlers only)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """How an attempt ended, as :meth:`Middleware.settled` hears of it.

    ``outcome`` is the label of its outcome (done, failed, dead, canceled,
    delayed, preserved, abandoned); ``state`` the state written (None when
    nothing is: abandoned); ``error`` what the attempt raised (the handler or a
    middleware), or, for a worker process that died while it ran the job, a
    ``WorkerCrashed`` saying how; ``retry_in`` the delay before the retry (failed);
    ``written`` whether the outcome was written (None: handed to the supervisor,
    which writes it a few milliseconds later); ``started_at`` and ``duration_s``
    when the attempt began and how long it ran.
    """

    outcome: str
    state: State | None
    error: BaseException | None
    retry_in: timedelta | None
    written: bool | None
    started_at: datetime
    duration_s: float


class Middleware:
    """Wraps enqueues and handler runs. Subclass it and override the hooks you need.

    - ``enqueue(jobs, call_next)``: every ``queue.enqueue``, ``enqueue_many`` and
      ``enqueue_workflow`` (a list of the jobs, in order); return ``call_next(jobs)``,
      with the jobs as they are or replaced (``dataclasses.replace``).
      ``enqueue_async`` is the same for ``queue.enqueue_async`` and
      ``enqueue_many_async``.
    - ``run(claim, call_next)``: every attempt of every handler, sync or async, in
      the process that runs it (a worker of ``brooq supervise``, ``brooq work``,
      ``queue.drain()``); for an async handler ``call_next`` runs it to its end,
      and context variables set before the call are seen inside it.
      ``run_async`` wraps async handlers only, inside their event loop.
    - ``settled(claim, settled)``: once the attempt's outcome is decided (a
      notification; what it raises is logged and ignored). For a worker process
      that died or was killed while running the job, it is called in the
      supervisor.
    - ``process_exit()``: in a worker process of ``brooq supervise`` before it
      exits (through ``os._exit``, so no ``atexit`` hook runs there): flush what
      you buffer.

    An exception raised by ``run`` (or ``run_async``) fails the attempt exactly as
    the handler's would (retried, or dead on the last attempt), never the worker; one
    raised by ``enqueue`` reaches the caller, and what ``call_next`` did not write is
    not written.
    """

    def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
        """Wrap a synchronous enqueue of ``jobs``; return what ``call_next`` returns."""
        return call_next(jobs)

    async def enqueue_async(self, jobs: list[Job], call_next: AsyncEnqueueNext) -> list[Enqueued]:
        """Wrap an asyncio enqueue of ``jobs``; return what ``call_next`` returns."""
        return await call_next(jobs)

    def run(self, claim: Claim, call_next: RunNext) -> Any:
        """Wrap one attempt of a handler; return what ``call_next`` returns."""
        return call_next(claim)

    async def run_async(self, claim: Claim, call_next: AsyncRunNext) -> Any:
        """Wrap one attempt of an async handler inside its event loop."""
        return await call_next(claim)

    def settled(self, claim: Claim, settled: Settled) -> None:
        """Hear how an attempt ended."""

    def process_exit(self) -> None:
        """A worker process is about to exit."""


HOOKS = ("enqueue", "enqueue_async", "run", "run_async", "settled", "process_exit")


def _defines(middleware: object, hook: str) -> bool:
    """True when ``middleware`` has ``hook`` of its own (not Middleware's pass-through)."""
    own = getattr(type(middleware), hook, None)
    return own is not None and own is not getattr(Middleware, hook)


class MiddlewareStack:
    """The middleware of one application, in order, and per hook those that define it."""

    def __init__(self, middleware: Sequence[object] = ()) -> None:
        self.all: tuple[object, ...] = ()
        self.by_hook: dict[str, tuple[Any, ...]] = {hook: () for hook in HOOKS}
        for item in middleware:
            self.add(item)

    def add(self, middleware: object) -> None:
        """Register ``middleware`` innermost of those registered so far."""
        if not any(_defines(middleware, hook) for hook in HOOKS):
            raise TypeError(
                f"{type(middleware).__name__} defines none of the middleware hooks "
                f"({', '.join(HOOKS)}); subclass brooq.Middleware and override some"
            )
        self.all += (middleware,)
        for hook in HOOKS:
            if _defines(middleware, hook):
                self.by_hook[hook] += (middleware,)

    def __bool__(self) -> bool:
        return bool(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def enqueue(self, jobs: list[Job], write: EnqueueNext) -> list[Enqueued]:
        """``write(jobs)`` through every ``enqueue`` hook."""
        return _chain(self.by_hook["enqueue"], "enqueue", write)(jobs)  # type: ignore[no-any-return]

    async def enqueue_async(self, jobs: list[Job], write: AsyncEnqueueNext) -> list[Enqueued]:
        """``await write(jobs)`` through every ``enqueue_async`` hook."""
        return await _chain(self.by_hook["enqueue_async"], "enqueue_async", write)(jobs)  # type: ignore[no-any-return]

    def run(self, claim: Claim, handler: RunNext) -> Any:
        """``handler(claim)`` through every ``run`` hook."""
        return _chain(self.by_hook["run"], "run", handler)(claim)

    def run_async(self, claim: Claim, handler: AsyncRunNext) -> Awaitable[Any]:
        """The awaitable of ``handler(claim)`` through every ``run_async`` hook."""
        return _chain(self.by_hook["run_async"], "run_async", handler)(claim)  # type: ignore[no-any-return]

    def settled(self, claim: Claim, settled: Settled) -> None:
        """Tell every ``settled`` hook, in order; what one raises is logged, never raised."""
        for middleware in self.by_hook["settled"]:
            try:
                middleware.settled(claim, settled)
            except BaseException:  # a notification must not fail a worker or a supervisor
                log.warning("middleware settled hook failed", exc_info=True)

    def process_exit(self) -> None:
        """Tell every ``process_exit`` hook, in order; failures are logged."""
        for middleware in self.by_hook["process_exit"]:
            try:
                middleware.process_exit()
            except BaseException:
                log.warning("middleware process_exit hook failed", exc_info=True)


def _chain(hooks: tuple[Any, ...], name: str, last: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``last`` wrapped by the ``name`` hook of each of ``hooks``, the first outermost."""
    call = last
    for middleware in reversed(hooks):
        call = _bind(getattr(middleware, name), call)
    return call


def _bind(hook: Callable[[Any, Any], Any], call_next: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def step(value: Any) -> Any:
        return hook(value, call_next)

    return step


def settled_of(
    outcome: str,
    state: State | None,
    error: BaseException | None,
    retry_in: timedelta | None,
    written: bool | None,
    started: float,
) -> Settled:
    """A Settled for an attempt that began at ``started`` (``time.monotonic()``) and ends now."""
    duration = max(0.0, time.monotonic() - started)
    began = datetime.now(UTC) - timedelta(seconds=duration)
    return Settled(outcome, state, error, retry_in, written, began, duration)


__all__ = ["Middleware", "MiddlewareStack", "Settled", "settled_of"]
