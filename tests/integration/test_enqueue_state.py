"""An enqueue whose key matches an existing job says that job's state (``Enqueued.state``), on
both stores, through the public Queue API and the CLI; and the documented way to run a dead
job's work again under the same key works (README, "Enqueue inside your own transaction")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.testing import InMemoryStore

KEY = "order-42"


def fail(claim: brooq.Claim) -> None:
    raise RuntimeError("mailer down")


@pytest.fixture(params=["memory", "postgres"])
def queue(request: pytest.FixtureRequest) -> Iterator[brooq.Queue]:
    """A queue on each store, with one kind that always fails (max_attempts=1)."""
    target: Any = InMemoryStore() if request.param == "memory" else request.getfixturevalue("dsn")
    q = brooq.Queue(target)
    q.register("email.send", fail, max_attempts=1)
    q.register("report.build", lambda claim: None)
    yield q
    q.close()


def job(topic: str = "email.send") -> brooq.Job:
    return brooq.Job(topic=topic, payload={"to": "a@example.com"}, idempotency_key=KEY)


def test_a_key_held_by_a_dead_job_says_dead(queue: brooq.Queue) -> None:
    first = queue.enqueue(job())
    assert first.created and first.state is brooq.State.PENDING
    again = queue.enqueue(job())
    assert (again.id, again.created, again.state) == (first.id, False, brooq.State.PENDING)
    assert queue.drain().outcomes == {"dead": 1}

    dead = queue.enqueue(job())
    job_id, created = dead  # still unpacks as the pair it always was
    assert (job_id, created, dead.state) == (first.id, False, brooq.State.DEAD)
    assert queue.get(first.id).state is brooq.State.DEAD  # untouched

    other = queue.enqueue(job("report.build"))  # keys are per topic
    assert other.created and queue.drain().outcomes == {"done": 1}
    assert queue.enqueue(job("report.build")).state is brooq.State.DONE


def test_the_readme_way_to_run_a_dead_job_again_under_its_key(dsn: str) -> None:
    queue = brooq.Queue(dsn)
    queue.register("email.send", fail, max_attempts=1)
    dead = queue.enqueue(job())
    queue.drain()
    assert queue.enqueue(job()).state is brooq.State.DEAD

    with pytest.raises(RuntimeError), psycopg.connect(dsn) as conn:  # rolled back: both
        conn.execute("DELETE FROM job WHERE id = %s AND state = 'dead'", (dead.id,))
        assert queue.enqueue(job(), conn=conn).created
        raise RuntimeError("changed my mind")
    assert queue.get(dead.id).state is brooq.State.DEAD

    with psycopg.connect(dsn) as conn:
        conn.execute("DELETE FROM job WHERE id = %s AND state = 'dead'", (dead.id,))
        again = queue.enqueue(job(), conn=conn)
    assert again.created and again.state is brooq.State.PENDING and again.id != dead.id
    row = queue.get(again.id)
    assert (row.state, row.attempts, row.expirations) == (brooq.State.PENDING, 0, 0)
    queue.close()


def test_the_cli_prints_the_state_and_how_to_run_it_again(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # A row written by hand holds its key once job_key says so, as brooq's enqueue writes it.
    pg.execute(
        "WITH dead AS (INSERT INTO job (topic, payload, state, attempts, idempotency_key, "
        "last_error) VALUES ('email.send', '{}', 'dead', 5, %s, 'RuntimeError: mailer down') "
        "RETURNING id, topic, idempotency_key) "
        "INSERT INTO job_key (topic, idempotency_key, job_id) "
        "SELECT topic, idempotency_key, id FROM dead",
        (KEY,),
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("QUEUE_", "BROOQ_", "LOG_")) and k != "DATABASE_URL"
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "brooq.cli",
            "enqueue",
            "--topic",
            "email.send",
            "--payload",
            "{}",
            "--key",
            KEY,
        ],
        cwd=tmp_path,
        env={**env, "DATABASE_URL": dsn},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["created"], answer["state"]) == (False, "dead")
    assert done.stderr.strip() == (
        "brooq: a job with this key already exists (dead); nothing enqueued; to run it again, "
        "enqueue without --key, or delete that row first"
    )
