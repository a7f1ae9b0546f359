"""brooq: a PostgreSQL-backed job queue. Jobs are rows of one table; workers are processes.

Public API::

    queue = brooq.Queue(dsn_or_pool)

    @queue.kind("email.send", max_attempts=5, attempt_timeout="1m")
    def send(claim: brooq.Claim) -> None: ...

    job_id, created = queue.enqueue(brooq.Job(topic="email.send", payload={...}))
    queue.enqueue(job, conn=my_conn)      # inside your own transaction
    queue.enqueue(brooq.Job(topic="report.send", after=[job_id]))  # waits for job_id
"""

from typing import TYPE_CHECKING, Any

from brooq.engine.middleware import Middleware, Settled
from brooq.vocabulary import (
    AttemptTimedOut,
    BrooqError,
    CancelJob,
    Claim,
    Delay,
    EnqueueConflict,
    Enqueued,
    Handle,
    Interrupted,
    InvalidJob,
    InvalidKindOptions,
    InvalidTopic,
    Job,
    JobCanceled,
    JobCanceledWhileRunning,
    JobDead,
    JobFailed,
    JobNotFound,
    JobRecord,
    KindOptions,
    Lease,
    LeaseLost,
    NeedsDatabase,
    Parent,
    PreserveAttempt,
    RateLimit,
    ResultNotJSON,
    ResultTimeout,
    ResultTooLarge,
    SchemaBehind,
    State,
    StoreUnavailable,
    Topic,
    TopicPause,
    Workflow,
)

if TYPE_CHECKING:
    from brooq.async_enqueue import enqueue_async
    from brooq.queue import Drained, Queue

__version__ = "0.1.0"

_LAZY = {"Drained", "Queue", "enqueue_async"}


def __getattr__(name: str) -> Any:
    # The Queue pulls in psycopg; importing brooq.vocabulary or brooq.engine
    # (or just brooq) must not, so it loads on first use.
    if name in _LAZY:
        if name == "enqueue_async":
            from brooq.async_enqueue import enqueue_async

            return enqueue_async
        from brooq import queue

        return getattr(queue, name)
    raise AttributeError(f"module 'brooq' has no attribute {name!r}")


__all__ = [
    "AttemptTimedOut",
    "BrooqError",
    "CancelJob",
    "Claim",
    "Delay",
    "Drained",
    "EnqueueConflict",
    "Enqueued",
    "Handle",
    "Interrupted",
    "InvalidJob",
    "InvalidKindOptions",
    "InvalidTopic",
    "Job",
    "JobCanceled",
    "JobCanceledWhileRunning",
    "JobDead",
    "JobFailed",
    "JobNotFound",
    "JobRecord",
    "KindOptions",
    "Lease",
    "LeaseLost",
    "Middleware",
    "NeedsDatabase",
    "Parent",
    "PreserveAttempt",
    "Queue",
    "RateLimit",
    "ResultNotJSON",
    "ResultTimeout",
    "ResultTooLarge",
    "SchemaBehind",
    "Settled",
    "State",
    "StoreUnavailable",
    "Topic",
    "TopicPause",
    "Workflow",
    "__version__",
    "enqueue_async",
]
