"""Settings of the worker processes: how many, what they serve, leases, recycling, stopping."""

from __future__ import annotations

from datetime import timedelta

from brooq.config import values as v
from brooq.config.settings.key import SUPERVISE, WORK, Key, KeyTable

MIN_LEASE = timedelta(seconds=1)
MIN_POLL_INTERVAL = timedelta(milliseconds=50)


class WorkerKeys(KeyTable):
    """QUEUE_WORKERS, QUEUE_TOPICS, the lease and poll interval, and the worker lifecycle."""

    workers: Key[int | str] = Key(
        "QUEUE_WORKERS",
        v.WORKERS,
        "2",
        "Worker processes of a supervisor: a count (8) or topic=count pairs "
        "(email.send=4,report=2).",
        section="workers",
        commands=(SUPERVISE,),
    )
    topics: Key[tuple[str, ...] | None] = Key(
        "QUEUE_TOPICS",
        v.TOPICS,
        None,
        "Comma-separated topics to serve. Empty: every topic the app handles.",
        section="workers",
        example="email.send,report",
        commands=(WORK, SUPERVISE),
    )
    poll_interval: Key[timedelta] = Key(
        "QUEUE_POLL_INTERVAL",
        v.duration(
            zero_ok=False,
            at_least=MIN_POLL_INTERVAL,
            why=": every idle supervisor would query the database that often",
        ),
        "1s",
        "How often idle workers look for jobs when no NOTIFY wakes them (at least 50ms).",
        section="workers",
        commands=(WORK, SUPERVISE),
    )
    lease: Key[timedelta] = Key(
        "QUEUE_LEASE",
        v.duration(
            zero_ok=False,
            at_least=MIN_LEASE,
            why=": a lease runs out before its heartbeat (every lease/3) can extend it, "
            "and the job is claimed again while it runs",
        ),
        "2m",
        "Lease of a claimed job, extended every lease/3 while it runs; how long a job of a "
        "dead host waits before the reaper returns it (at least 1s).",
        section="workers",
        commands=(WORK, SUPERVISE),
    )
    watchdog_grace: Key[timedelta] = Key(
        "QUEUE_WATCHDOG_GRACE",
        v.duration(zero_ok=False),
        None,
        "How long an interrupted handler (timeout, cancel, lease lost) may take to exit "
        "before SIGKILL. Empty: the lease.",
        section="workers",
        example="1m, or leave it unset to use the lease",
        commands=(SUPERVISE,),
        computed=lambda values: values["lease"],
    )
    max_jobs_per_worker: Key[int] = Key(
        "QUEUE_MAX_JOBS_PER_WORKER",
        v.integer(0),
        "0",
        "Recycle a worker process after this many jobs (0 = never).",
        section="workers",
        example="1000, or 0 for unlimited",
        commands=(SUPERVISE,),
    )
    max_memory_per_worker: Key[int] = Key(
        "QUEUE_MAX_MEMORY_PER_WORKER",
        v.size(zero_ok=True),
        "0",
        "Recycle a worker process above this resident size, between jobs (0 = no limit).",
        section="workers",
        example="512MiB, or 0 for unlimited",
        commands=(SUPERVISE,),
    )
    worker_connection_idle: Key[timedelta] = Key(
        "QUEUE_WORKER_CONNECTION_IDLE",
        v.duration(
            zero_ok=False,
            at_least=timedelta(seconds=1),
            why=": a worker would close and open its connection between jobs",
        ),
        "1m",
        "Close a worker's own database connection (opened for jobs with chain or "
        "on_succeeded) once it went unused this long; its next such job opens it again "
        "(at least 1s).",
        section="workers",
        commands=(SUPERVISE,),
    )
    prefetch: Key[int | None] = Key(
        "QUEUE_PREFETCH",
        v.integer(0, 10_000),
        None,
        "Jobs a supervisor claims ahead of its idle workers, so a worker that finishes gets "
        "its next job without waiting for the database. Empty: the number of workers; 0: "
        "claim only for idle workers.",
        section="workers",
        example="8, or 0",
        commands=(SUPERVISE,),
    )
    graceful_timeout: Key[timedelta] = Key(
        "QUEUE_GRACEFUL_TIMEOUT",
        v.duration(zero_ok=True),
        "30s",
        "On SIGTERM, how long running jobs may finish before their workers are killed "
        "(their jobs go back to pending, uncharged).",
        section="workers",
        commands=(SUPERVISE,),
    )
