"""A job's own options, honoured by a real ``brooq supervise``: the retry decision in the
worker, the soft timeout in the worker, the watchdog's kill in the supervisor, and the
retry schedule. The kind allows far more (5 attempts, 50 s soft, 60 s hard, 1 s backoff)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import brooq
from tests.system.harness import run_cli, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = ("--workers", "2", "--http-addr", "127.0.0.1:0", "--poll-interval", "200ms")


def row(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    cur = pg.execute(
        "SELECT state, attempts, last_error, "
        "extract(epoch FROM available_at - updated_at) AS retry_in_s FROM job WHERE id = %s",
        (job_id,),
    )
    found = cur.fetchone()
    assert found is not None
    return dict(zip([d.name for d in cur.description or []], found, strict=True))


@pytest.mark.timeout(90)
def test_a_supervisor_runs_each_job_by_its_own_options(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any
) -> None:
    queue = brooq.Queue(dsn)
    once, killed, soft, slow, plain = (
        r.id
        for r in queue.enqueue_many(
            [
                brooq.Job("flaky", max_attempts=1),
                brooq.Job("flaky", {"sleep": 30}, max_execution_timeout="1s", max_attempts=1),
                brooq.Job("flaky", {"sleep": 30}, attempt_timeout="1s", max_attempts=1),
                brooq.Job("flaky", backoff_base="1h", backoff_max="1h"),
                brooq.Job("flaky"),
            ]
        )
    )
    queue.close()
    started = time.monotonic()
    sup = supervise(*ARGS, app="sysapp_overrides:queue")

    def ended(job_id: str) -> bool:
        return bool(row(pg, job_id)["state"] == "dead")

    wait_until(lambda: ended(once) and ended(killed) and ended(soft), 30, "three jobs dead")
    assert time.monotonic() - started < 25  # neither slept its 30 s: the kind's limits are 50/60 s
    assert row(pg, once)["attempts"] == 1  # the kind allows 5
    assert row(pg, once)["last_error"] == "RuntimeError: failed attempt 1 of 1"
    assert row(pg, killed)["last_error"].startswith(
        "WorkerCrashed: max_execution_timeout exceeded; the supervisor killed the worker"
    )
    assert row(pg, soft)["last_error"].startswith("AttemptTimedOut")
    assert sup.events("JobDead", job_id=killed)

    wait_until(lambda: row(pg, slow)["state"] == "failed", 15, "the slow job failed once")
    assert 1800 <= row(pg, slow)["retry_in_s"] <= 3600  # its own backoff: uniform in [30m, 1h]
    wait_until(lambda: row(pg, plain)["attempts"] >= 2, 15, "the plain job retried")
    assert row(pg, slow)["attempts"] == 1  # not retried meanwhile


@pytest.mark.timeout(60)
def test_brooq_work_runs_each_job_by_its_own_options(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Any
) -> None:
    queue = brooq.Queue(dsn)
    once, soft, slow = (
        r.id
        for r in queue.enqueue_many(
            [
                brooq.Job("flaky", max_attempts=1),
                brooq.Job("flaky", {"sleep": 30}, attempt_timeout="1s", max_attempts=1),
                brooq.Job("flaky", backoff_base="1h", backoff_max="1h"),
            ]
        )
    )
    queue.close()
    done = run_cli(dsn, tmp_path, "work", "--app", "sysapp_overrides:queue", "--exit-when-idle")
    assert done.returncode == 0, done.stderr
    assert (row(pg, once)["state"], row(pg, once)["attempts"]) == ("dead", 1)
    assert (row(pg, soft)["state"], row(pg, soft)["last_error"][:15]) == ("dead", "AttemptTimedOut")
    assert row(pg, slow)["state"] == "failed" and 1800 <= row(pg, slow)["retry_in_s"] <= 3600
