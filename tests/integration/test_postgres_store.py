"""What only the PostgreSQL store can show: constraints, races, transactions, NOTIFY, retention."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import brooq
from brooq import Job
from brooq.engine.outcome import DONE, decide
from brooq.engine.store import TopicCount
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import BUILTIN_KIND_DEFAULTS, KindOptions, State
from tests.integration.helpers import claim_race_worker, count_jobs, run_one

LEASE = timedelta(minutes=1)


def _one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# -- invariant 1: a processing row always has a holder and a lease -----------------------------


@pytest.mark.parametrize(
    "assignment",
    [
        "state = 'processing'",
        "state = 'processing', locked_by = 'w1'",
        "state = 'processing', locked_until = now() + interval '1 minute'",
    ],
)
def test_processing_without_holder_or_lease_is_rejected(
    pg: psycopg.Connection[Any], pg_store: PostgresStore, assignment: str
) -> None:
    (job,) = pg_store.enqueue_many([Job("work")])
    with pytest.raises(psycopg.errors.CheckViolation, match="job_processing_lease_check"):
        pg.execute(f"UPDATE job SET {assignment} WHERE id = %s", (job.id,))
    assert pg_store.get(job.id).state is State.PENDING


def test_a_held_row_cannot_lose_its_holder(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    pg_store.enqueue_many([Job("work")])
    claimed = pg_store.claim("w1", ["work"], LEASE)
    assert claimed is not None
    for column in ("locked_by", "locked_until"):
        with pytest.raises(psycopg.errors.CheckViolation):
            pg.execute(f"UPDATE job SET {column} = NULL WHERE id = %s", (claimed.id,))
    with pytest.raises(psycopg.errors.CheckViolation):
        pg.execute("INSERT INTO job (topic, state) VALUES ('work', 'processing')")


def test_claim_sets_holder_and_lease_together(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    pg_store.enqueue_many([Job("work", i) for i in range(20)])
    claims = [pg_store.claim(f"w{i}", ["work"], LEASE) for i in range(20)]
    assert all(c is not None for c in claims)
    assert count_jobs(pg, "state = 'processing'") == 20
    unheld = "state = 'processing' AND (locked_by IS NULL OR locked_until IS NULL)"
    assert count_jobs(pg, unheld) == 0
    pg.execute("UPDATE job SET locked_until = now() - interval '1 second'")
    assert pg_store.requeue_expired().pending == [TopicCount("work", 20)]
    assert count_jobs(pg, "state = 'pending' AND locked_by IS NULL AND locked_until IS NULL") == 20


# -- invariant 2: never held by two workers; the claim race ------------------------------------


def test_claim_race_every_job_handled_once(pg: psycopg.Connection[Any], dsn: str) -> None:
    """8 processes race over 2,000 jobs of two topics: each ends done after exactly one attempt.

    Half the processes serve both topics (the multi-topic claim), the others one
    topic each (the single-topic claim), so both statements race each other.
    """
    total = 2000
    pg.execute(
        "INSERT INTO job (topic, payload) "
        "SELECT CASE WHEN i %% 2 = 0 THEN 'race.a' ELSE 'race.b' END, to_jsonb(i) "
        "FROM generate_series(1, %s) AS i",
        (total,),
    )
    served = [["race.a", "race.b"]] * 4 + [["race.a"]] * 2 + [["race.b"]] * 2
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(served))
    results = ctx.Queue()
    workers = [
        ctx.Process(target=claim_race_worker, args=(dsn, topics, start, results), daemon=True)
        for topics in served
    ]
    for w in workers:
        w.start()
    try:
        reports = [results.get(timeout=90) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
                w.join(timeout=5)
    errors = [r[3] for r in reports if r[3]]
    assert errors == []
    handled = [job_id for r in reports for job_id in r[1]]
    lost = [job_id for r in reports for job_id in r[2]]
    assert lost == [], "a settle lost its lease although nothing expired"
    assert len(handled) == len(set(handled)), "a job was handled twice"
    all_ids = {str(r[0]) for r in pg.execute("SELECT id FROM job")}
    assert set(handled) == all_ids and len(all_ids) == total
    assert _one(pg, "SELECT count(*) FROM job WHERE state = 'done' AND attempts = 1") == total
    assert sum(1 for r in reports if r[1]) >= 2, "the race had a single runner"


# -- invariants 4 and 5: the outcome lives in the row; the payload is opaque JSON --------------


PAYLOADS = [
    None,
    True,
    False,
    0,
    -17,
    2**63,
    2**100,
    3.25,
    -0.5,
    1e-7,
    0.1,
    "",
    "null",
    "plain text",
    'quotes " and \\ backslashes \n\t',
    "unicode é ß Ωmega 漢字 🎉 \u2028 \u200b \U0010fffd",
    [],
    {},
    [1, "two", None, [3.5, {"x": []}]],
    {"nested": {"deep": {"deeper": [1, {"k": "v"}]}}, "b": False, "n": None},
    {"": "empty key", "🔑": "emoji key", "a.b": {"$ref": "#/x"}},
    {"order": 1, "matters": 2, "not": 3},
]
_deep: Any = "bottom"
for _ in range(60):
    _deep = {"level": [_deep]}
PAYLOADS.append(_deep)


@pytest.mark.parametrize("payload", PAYLOADS, ids=[f"p{i}" for i in range(len(PAYLOADS))])
def test_payload_round_trips(pg: psycopg.Connection[Any], dsn: str, payload: Any) -> None:
    queue = brooq.Queue(dsn)
    try:
        job_id, created = queue.enqueue(Job("work", payload))
        assert created
        assert queue.get(job_id).payload == payload
        stored = _one(pg, "SELECT payload FROM job WHERE id = %s", (job_id,))
        assert stored == payload
        assert _one(pg, "SELECT payload IS NOT NULL FROM job WHERE id = %s", (job_id,))
        claimed = queue.store.claim("w1", ["work"], LEASE)
        assert claimed is not None and claimed.payload == payload
        assert type(claimed.payload) is type(payload)
    finally:
        queue.close()


def test_null_payload_is_json_null(pg: psycopg.Connection[Any], pg_store: PostgresStore) -> None:
    (job,) = pg_store.enqueue_many([Job("work")])
    assert _one(pg, "SELECT jsonb_typeof(payload) FROM job WHERE id = %s", (job.id,)) == "null"


def test_the_outcome_is_read_from_the_row_alone(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    """Invariant 4: no delivery log; the job's fate is one SELECT of its row."""
    tables_before = _tables(pg)
    (job,) = pg_store.enqueue_many([Job("work")])
    claimed = pg_store.claim("w1", ["work"], LEASE)
    assert claimed is not None
    opts = KindOptions(max_attempts=2).with_defaults(BUILTIN_KIND_DEFAULTS)
    assert pg_store.settle(claimed.ticket, decide(RuntimeError("first"), 1, opts))
    pg.execute("UPDATE job SET available_at = now()")
    claimed = pg_store.claim("w1", ["work"], LEASE)
    assert claimed is not None
    assert pg_store.settle(claimed.ticket, decide(RuntimeError("second"), 2, opts))
    assert _tables(pg) == tables_before
    # The other tables say which supervisors are alive (brooq workers), which job holds an
    # idempotency key (job_key), what the rate limits' buckets hold and which jobs wait for
    # which (job_edge, workflows), which topics are paused; no job's fate. job's partitions are job.
    assert {
        t for t in tables_before if not t.startswith(("_yoyo", "yoyo", "job_p", "job_initial"))
    } == {
        "job",
        "job_default",
        "job_key",
        "job_edge",
        "brooq_supervisor",
        "brooq_rate_limit",
        "brooq_topic_pause",
        "brooq_fair_cursor",
    }
    row = pg.execute(
        "SELECT state, attempts, last_error FROM job WHERE id = %s", (job.id,)
    ).fetchone()
    assert row == ("dead", 2, "RuntimeError: second")


def _tables(pg: psycopg.Connection[Any]) -> set[str]:
    return {
        r[0]
        for r in pg.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', "
            "'information_schema')"
        )
    }


# -- enqueue inside the caller's transaction ---------------------------------------------------


def test_enqueue_in_the_callers_transaction(
    pg: psycopg.Connection[Any], pg_store: PostgresStore, dsn: str
) -> None:
    queue = brooq.Queue(dsn)
    pg.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO orders VALUES (1)")
        rolled = queue.enqueue(Job("email.send", {"order": 1}), conn=conn)
        assert rolled.created
        assert count_jobs(pg) == 0, "visible before commit"
        assert pg_store.claim("w1", ["email.send"], LEASE) is None
        conn.rollback()
        assert count_jobs(pg) == 0 and _one(pg, "SELECT count(*) FROM orders") == 0
        with pytest.raises(brooq.JobNotFound):
            pg_store.get(rolled.id)

        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            kept = queue.enqueue(Job("email.send", {"order": 2}), conn=conn)
            assert count_jobs(pg) == 0
        assert count_jobs(pg) == 1 and _one(pg, "SELECT count(*) FROM orders") == 1

        with pytest.raises(ZeroDivisionError), conn.transaction():
            queue.enqueue(Job("email.send", {"order": 3}), conn=conn)
            _ = 1 / 0
        assert count_jobs(pg) == 1
    claimed = pg_store.claim("w1", ["email.send"], LEASE)
    assert claimed is not None and claimed.id == kept.id and claimed.payload == {"order": 2}
    queue.close()


def test_enqueue_many_in_the_callers_transaction_sees_its_own_keys(
    pg: psycopg.Connection[Any], dsn: str
) -> None:
    queue = brooq.Queue(dsn)
    with psycopg.connect(dsn) as conn:
        first = queue.enqueue(Job("work", idempotency_key="k"), conn=conn)
        again = queue.enqueue_many([Job("work", idempotency_key="k"), Job("work")], conn=conn)
        assert again[0] == (first.id, False) and again[1].created
        conn.commit()
    assert count_jobs(pg) == 2
    queue.close()


def test_enqueue_async_in_the_callers_transaction(
    pg: psycopg.Connection[Any], pg_store: PostgresStore, dsn: str
) -> None:
    async def scenario() -> tuple[str, str]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            rolled = await brooq.enqueue_async(aconn, Job("email.send", {"n": 1}))
            assert rolled.created
            assert count_jobs(pg) == 0
            await aconn.rollback()
            kept = await brooq.enqueue_async(
                aconn, Job("email.send", {"n": 2}, idempotency_key="async-k")
            )
            same = await brooq.Queue(dsn).enqueue_async(
                Job("email.send", {"n": 3}, idempotency_key="async-k"), conn=aconn
            )
            assert same == (kept.id, False)
            assert count_jobs(pg) == 0
            await aconn.commit()
            return rolled.id, kept.id

    rolled_id, kept_id = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert count_jobs(pg) == 1
    with pytest.raises(brooq.JobNotFound):
        pg_store.get(rolled_id)
    claimed = pg_store.claim("w1", ["email.send"], LEASE)
    assert claimed is not None and claimed.id == kept_id and claimed.payload == {"n": 2}


def test_a_rejected_job_leaves_the_callers_transaction_usable(
    pg: psycopg.Connection[Any], dsn: str
) -> None:
    queue = brooq.Queue(dsn)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(brooq.InvalidJob):
            queue.enqueue(Job("work", {"bad": object()}), conn=conn)
        queue.enqueue(Job("work", "good"), conn=conn)
        conn.commit()
    assert count_jobs(pg) == 1
    queue.close()


def _wait_for_lock_wait(pg: psycopg.Connection[Any]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _one(
            pg,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'",
        ):
            return
        time.sleep(0.02)
    raise AssertionError("the second enqueue never waited for the first transaction")


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
def test_same_key_from_two_transactions_at_once(
    pg: psycopg.Connection[Any], dsn: str, first_commits: bool
) -> None:
    """The second enqueue waits for the first transaction, then dedups or creates."""
    queue = brooq.Queue(dsn)
    results: list[Any] = []
    with psycopg.connect(dsn) as first:
        mine = queue.enqueue(Job("work", "first", idempotency_key="k"), conn=first)
        second = threading.Thread(
            target=lambda: results.append(
                queue.enqueue(Job("work", "second", idempotency_key="k"))
            ),
            daemon=True,
        )
        second.start()
        try:
            _wait_for_lock_wait(pg)
        finally:
            if first_commits:
                first.commit()
            else:
                first.rollback()
        second.join(timeout=20)
        assert not second.is_alive()
    (theirs,) = results
    if first_commits:
        assert theirs == (mine.id, False)
        assert queue.get(mine.id).payload == "first"
    else:
        assert theirs.created and theirs.id != mine.id
        assert queue.get(theirs.id).payload == "second"
    assert count_jobs(pg) == 1
    queue.close()


# -- settle after cancel -----------------------------------------------------------------------


def test_settle_after_cancel_changes_nothing(dsn: str, pg_store: PostgresStore) -> None:
    queue = brooq.Queue(dsn)
    job_id, _ = queue.enqueue(Job("work"))
    claimed = pg_store.claim("w1", ["work"], LEASE)
    assert claimed is not None
    assert queue.cancel(job_id, reason="operator") is True
    before = pg_store.get(job_id)
    assert pg_store.settle(claimed.ticket, DONE) is False
    assert pg_store.heartbeat([claimed.ticket], LEASE) == set()
    after = pg_store.get(job_id)
    assert after == before and after.state is State.CANCELED
    assert after.last_error == "canceled: operator"
    queue.close()


# -- chain and on_succeeded: exactly once, in the settle transaction ---------------------------


@pytest.fixture
def effects(pg: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    pg.execute("CREATE TABLE effect (job_id uuid, note text)")
    return pg


def _effect_hook(claim: brooq.Claim, note: str = "sent") -> Any:
    def hook(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO effect VALUES (%s, %s)", (claim.id, note))

    return hook


def test_chain_and_hook_commit_with_done(
    effects: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    (job,) = pg_store.enqueue_many([Job("work", {"order": 7})])

    def handler(claim: brooq.Claim) -> None:
        claim.chain(Job("next.step", {"after": claim.id}))
        claim.chain(Job("next.step", {"second": True}, idempotency_key="once"))
        claim.on_succeeded(_effect_hook(claim, "first"))
        claim.on_succeeded(_effect_hook(claim, "second"))

    attempted = run_one(pg_store, handler)
    assert attempted is not None and attempted.written and attempted.outcome.label == "done"
    assert pg_store.get(job.id).state is State.DONE
    chained = effects.execute(
        "SELECT payload, state FROM job WHERE topic = 'next.step' ORDER BY id"
    ).fetchall()
    assert chained == [({"after": job.id}, "pending"), ({"second": True}, "pending")]
    notes = effects.execute("SELECT job_id::text, note FROM effect ORDER BY note").fetchall()
    assert notes == [(job.id, "first"), (job.id, "second")]


@pytest.mark.parametrize("max_attempts,state", [(3, State.FAILED), (1, State.DEAD)])
def test_a_failing_hook_rolls_everything_back(
    effects: psycopg.Connection[Any], pg_store: PostgresStore, max_attempts: int, state: State
) -> None:
    (job,) = pg_store.enqueue_many([Job("work")])

    def handler(claim: brooq.Claim) -> None:
        claim.chain(Job("next.step", "must not exist"))
        claim.on_succeeded(_effect_hook(claim))

        def explode(conn: psycopg.Connection[Any]) -> None:
            raise RuntimeError("hook exploded")

        claim.on_succeeded(explode)

    attempted = run_one(pg_store, handler, max_attempts=max_attempts)
    assert attempted is not None and attempted.written
    row = pg_store.get(job.id)
    assert (row.state, row.attempts) == (state, 1)
    assert row.last_error is not None and "RuntimeError: hook exploded" in row.last_error
    assert count_jobs(effects, "topic = 'next.step'") == 0
    assert _one(effects, "SELECT count(*) FROM effect") == 0


@pytest.mark.parametrize("failure", ["bad-sql", "bad-chained-payload", "constraint"])
def test_database_errors_in_the_settle_transaction_roll_back(
    effects: psycopg.Connection[Any], pg_store: PostgresStore, failure: str
) -> None:
    effects.execute("ALTER TABLE effect ADD CONSTRAINT note_short CHECK (length(note) < 5)")
    (job,) = pg_store.enqueue_many([Job("work")])

    def handler(claim: brooq.Claim) -> None:
        claim.on_succeeded(_effect_hook(claim, "ok"))
        claim.chain(Job("next.step", "first"))
        if failure == "bad-sql":
            claim.on_succeeded(lambda conn: conn.execute("SELECT * FROM no_such_table"))
        elif failure == "bad-chained-payload":
            claim.chain(Job("next.step", {"not json": {1, 2}}))
        else:
            claim.on_succeeded(_effect_hook(claim, "far too long"))

    attempted = run_one(pg_store, handler)
    assert attempted is not None and attempted.written
    row = pg_store.get(job.id)
    assert (row.state, row.attempts) == (State.FAILED, 1)
    assert row.last_error is not None
    expected = {
        "bad-sql": "UndefinedTable",
        "bad-chained-payload": "InvalidJob",
        "constraint": "CheckViolation",
    }[failure]
    assert expected in row.last_error
    assert count_jobs(effects, "topic = 'next.step'") == 0
    assert _one(effects, "SELECT count(*) FROM effect") == 0
    # The store's connection survived the failed transaction.
    assert pg_store.claim("w1", ["work"], LEASE) is None


@pytest.mark.parametrize("how", ["canceled", "requeued-and-reclaimed"])
def test_lost_lease_writes_neither_outcome_nor_effects(
    effects: psycopg.Connection[Any], pg_store: PostgresStore, dsn: str, how: str
) -> None:
    (job,) = pg_store.enqueue_many([Job("work")])
    other = PostgresStore(dsn)

    def handler(claim: brooq.Claim) -> None:
        claim.chain(Job("next.step", "must not exist"))
        claim.on_succeeded(_effect_hook(claim))
        if how == "canceled":
            assert other.cancel(claim.id, reason="mid-run")
        else:
            effects.execute("UPDATE job SET locked_until = now() - interval '1 second'")
            assert other.requeue_expired().pending == [TopicCount("work", 1)]
            assert other.claim("worker-2", ["work"], LEASE) is not None

    try:
        attempted = run_one(pg_store, handler, holder="worker-1")
    finally:
        other.close()
    assert attempted is not None and attempted.outcome.label == "done"
    assert attempted.written is False
    row = pg_store.get(job.id)
    if how == "canceled":
        assert row.state is State.CANCELED and row.last_error == "canceled: mid-run"
    else:
        assert (row.state, row.locked_by, row.attempts) == (State.PROCESSING, "worker-2", 2)
    assert count_jobs(effects, "topic = 'next.step'") == 0
    assert _one(effects, "SELECT count(*) FROM effect") == 0


@pytest.mark.parametrize("failure", ["statement-timeout", "lock-timeout"])
def test_a_hook_timing_out_is_a_recorded_failure(
    effects: psycopg.Connection[Any], pg_store: PostgresStore, failure: str
) -> None:
    """Errors of the OperationalError family raised by a hook's own statements are the
    hook's failure: recorded (failed, then dead), not StoreUnavailable with the job
    left processing for the reaper, which would retry a poison hook forever."""
    (job,) = pg_store.enqueue_many([Job("work")])
    effects.execute("CREATE TABLE guarded (id int PRIMARY KEY)")
    effects.execute("INSERT INTO guarded VALUES (1)")

    def handler(claim: brooq.Claim) -> None:
        claim.chain(Job("next.step", "must not exist"))
        claim.on_succeeded(_effect_hook(claim))

        def slow(conn: psycopg.Connection[Any]) -> None:
            if failure == "statement-timeout":
                conn.execute("SET LOCAL statement_timeout = '20ms'")
                conn.execute("SELECT pg_sleep(5)")
            else:
                conn.execute("SET LOCAL lock_timeout = '20ms'")
                conn.execute("SELECT * FROM guarded FOR UPDATE")

        claim.on_succeeded(slow)

    locking = failure == "lock-timeout"
    with effects.transaction() if locking else contextlib.nullcontext():
        if locking:
            effects.execute("SELECT * FROM guarded FOR UPDATE")  # held during the settle
        attempted = run_one(pg_store, handler)
    assert attempted is not None and attempted.written
    row = pg_store.get(job.id)
    assert (row.state, row.attempts) == (State.FAILED, 1)
    expected = {"statement-timeout": "QueryCanceled", "lock-timeout": "LockNotAvailable"}[failure]
    assert row.last_error is not None and expected in row.last_error
    assert count_jobs(effects, "topic = 'next.step'") == 0
    assert _one(effects, "SELECT count(*) FROM effect") == 0


def test_a_hook_calling_back_into_its_queue_does_not_deadlock(
    pg: psycopg.Connection[Any], dsn: str
) -> None:
    queue = brooq.Queue(dsn)
    job_id, _ = queue.enqueue(Job("work"))
    seen: list[State] = []

    @queue.kind("work")
    def handler(claim: brooq.Claim) -> None:
        def follow_up(conn: psycopg.Connection[Any]) -> None:
            queue.enqueue(Job("follow.up", {"after": claim.id}))
            seen.append(queue.get(claim.id).state)

        claim.on_succeeded(follow_up)

    drained: list[brooq.Drained] = []
    worker = threading.Thread(target=lambda: drained.append(queue.drain()), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "queue.drain() deadlocked in a settle hook"
    assert drained and drained[0].outcomes == {"done": 1}
    assert queue.get(job_id).state is State.DONE
    assert count_jobs(pg, "topic = 'follow.up'") == 1
    assert seen == [State.DONE]
    queue.close()


# -- retention ---------------------------------------------------------------------------------


def test_retention_deletes_old_terminal_rows_in_batches(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    pg.execute(
        "INSERT INTO job (topic, payload, state, updated_at) "
        "SELECT 'old', to_jsonb(i), (ARRAY['done', 'dead', 'canceled'])[1 + i % 3], "
        "       now() - interval '2 days' - i * interval '1 minute' "
        "FROM generate_series(1, 250) AS i"
    )
    pg.execute(
        "INSERT INTO job (topic, state, updated_at) "
        "SELECT 'young', 'done', now() - interval '12 hours' FROM generate_series(1, 10)"
    )
    pg.execute(
        "INSERT INTO job (topic, state, attempts, updated_at) "
        "SELECT 'live', s, 1, now() - interval '90 days' "
        "FROM unnest(ARRAY['pending', 'failed']) AS s"
    )
    ttl = timedelta(days=1)

    assert pg_store.delete_terminal(ttl, 100) == [TopicCount("old", 100)]
    # Oldest first: the 100 oldest (i = 151..250) went first.
    assert _one(pg, "SELECT max((payload)::int) FROM job WHERE topic = 'old'") == 150
    assert pg_store.delete_terminal(ttl, 100) == [TopicCount("old", 100)]
    assert pg_store.delete_terminal(ttl, 100) == [TopicCount("old", 50)]
    assert pg_store.delete_terminal(ttl, 100) == []
    assert count_jobs(pg, "topic = 'old'") == 0
    assert count_jobs(pg, "topic = 'young'") == 10
    assert count_jobs(pg, "topic = 'live'") == 2
    assert pg_store.delete_terminal(timedelta(hours=11), 100) == [TopicCount("young", 10)]
    assert count_jobs(pg) == 2


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-5)])
def test_retention_ttl_zero_is_refused(
    pg: psycopg.Connection[Any], pg_store: PostgresStore, ttl: timedelta
) -> None:
    pg.execute(
        "INSERT INTO job (topic, state, updated_at) VALUES ('t', 'done', now() - interval '1 year')"
    )
    with pytest.raises(ValueError, match="0 disables retention"):
        pg_store.delete_terminal(ttl, 100)
    assert count_jobs(pg) == 1


# -- invariant 9: nothing starts unless asked --------------------------------------------------


def _backends(pg: psycopg.Connection[Any]) -> int:
    return int(
        _one(
            pg,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'",
        )
    )


def _wait_backends(pg: psycopg.Connection[Any], expected: int) -> int:
    deadline = time.monotonic() + 5
    while (n := _backends(pg)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def test_constructing_a_queue_opens_nothing(pg: psycopg.Connection[Any], dsn: str) -> None:
    threads = threading.active_count()
    before = _backends(pg)
    queue = brooq.Queue(dsn)
    quiet = brooq.Queue(dsn, notify=False, max_payload_bytes=10)

    @queue.kind("email.send", max_attempts=3, attempt_timeout="10s")
    def send(claim: brooq.Claim) -> None: ...

    store = PostgresStore(dsn)
    assert _backends(pg) == before
    assert threading.active_count() == threads
    queue.enqueue(Job("email.send"))  # the first operation connects: the probe is sound
    assert _wait_backends(pg, before + 1) == before + 1
    for closable in (queue, quiet, store):
        closable.close()
    assert _wait_backends(pg, before) == before
    assert threading.active_count() == threads


def test_importing_brooq_starts_no_thread_or_connection() -> None:
    code = (
        "import threading, brooq\n"
        "q = brooq.Queue('postgresql://nobody:pw@127.0.0.1:1/none')\n"
        "q.kind('a.b')(lambda claim: None)\n"
        "print(threading.active_count())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "1"


# -- NOTIFY ------------------------------------------------------------------------------------


def _notifications(conn: psycopg.Connection[Any], until_payload: str) -> list[tuple[str, str]]:
    """Notifications received until one carries ``until_payload`` (bounded wait)."""
    got: list[tuple[str, str]] = []
    for n in conn.notifies(timeout=10):
        got.append((n.channel, n.payload))
        if n.payload == until_payload:
            return got
    raise AssertionError(f"no notification {until_payload!r} within 10s; got {got}")


@pytest.fixture
def listener(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN brooq_job")
        conn.execute("LISTEN brooq_cancel")
        yield conn


def test_enqueue_notifies_the_topic(listener: psycopg.Connection[Any], dsn: str) -> None:
    loud, quiet = brooq.Queue(dsn), brooq.Queue(dsn, notify=False)
    try:
        quiet.enqueue(Job("quiet.topic"))
        quiet.enqueue_many([Job("quiet.topic"), Job("quiet.other")])
        loud.enqueue(Job("email.send"))
        loud.enqueue_many([Job("batch.a"), Job("batch.b"), Job("batch.a")])
        loud.enqueue(Job("email.send", idempotency_key="k"))
        loud.enqueue(Job("email.send", idempotency_key="k"))  # not inserted: no notification
        loud.enqueue(Job("sentinel"))
        got = _notifications(listener, "sentinel")
    finally:
        loud.close()
        quiet.close()
    assert {c for c, _ in got} == {"brooq_job"}
    payloads = [p for _, p in got]
    assert payloads[0] == "email.send"
    assert sorted(payloads[1:3]) == ["batch.a", "batch.b"]
    assert payloads[3:] == ["email.send", "sentinel"]


def test_no_notification_for_a_rolled_back_enqueue(
    listener: psycopg.Connection[Any], dsn: str
) -> None:
    queue = brooq.Queue(dsn)
    with psycopg.connect(dsn) as conn:
        queue.enqueue(Job("rolled.back"), conn=conn)
        conn.rollback()
        queue.enqueue(Job("committed"), conn=conn)
        conn.commit()
    assert _notifications(listener, "committed") == [("brooq_job", "committed")]
    queue.close()


def test_cancel_notifies_the_id(listener: psycopg.Connection[Any], dsn: str) -> None:
    queue = brooq.Queue(dsn, notify=False)
    try:
        job_id, _ = queue.enqueue(Job("work"))
        done_id, _ = queue.enqueue(Job("other"))
        assert queue.cancel(job_id) is True
        assert queue.cancel(job_id) is False  # already canceled: no second notification
        queue.cancel(done_id)
        got = _notifications(listener, done_id)
    finally:
        queue.close()
    assert got == [("brooq_cancel", job_id), ("brooq_cancel", done_id)]


# -- bad input: a clear brooq error, nothing written -------------------------------------------


class _NotJson:
    pass


BAD_PAYLOADS = [
    ({"x": _NotJson()}, "not JSON-serializable"),
    ({1, 2}, "not JSON-serializable"),
    (b"bytes", "not JSON-serializable"),
    ({"n": float("nan")}, "not JSON-serializable"),
    ([float("inf")], "not JSON-serializable"),
    ({(1, 2): "tuple key"}, "not JSON-serializable"),
    ("a\x00b", "NUL"),
    ({"key\x00": 1}, "NUL"),
    ([["deep", {"x": "\x00"}]], "NUL"),
    ("lone \ud800 surrogate", "surrogate"),
    ({"k": "\udfff"}, "surrogate"),
]


@pytest.mark.parametrize("payload,match", BAD_PAYLOADS, ids=[m for _, m in BAD_PAYLOADS])
def test_bad_payload_is_rejected(
    pg: psycopg.Connection[Any], dsn: str, payload: Any, match: str
) -> None:
    queue = brooq.Queue(dsn)
    with pytest.raises(brooq.InvalidJob, match=match) as info:
        queue.enqueue(Job("work", payload))
    assert isinstance(info.value, brooq.BrooqError)
    with pytest.raises(brooq.InvalidJob, match=match):
        queue.enqueue_many([Job("work", "fine"), Job("work", payload)])
    assert count_jobs(pg) == 0
    queue.close()


def test_a_payload_mentioning_nul_escaped_is_fine(pg: psycopg.Connection[Any], dsn: str) -> None:
    queue = brooq.Queue(dsn)
    job_id, _ = queue.enqueue(Job("work", "literally \\u0000"))
    assert queue.get(job_id).payload == "literally \\u0000"
    queue.close()


def test_too_large_payload_is_rejected(pg: psycopg.Connection[Any], dsn: str) -> None:
    queue = brooq.Queue(dsn, max_payload_bytes=100)
    with pytest.raises(brooq.InvalidJob, match=r"above the limit of 100"):
        queue.enqueue(Job("work", "x" * 101))
    with pytest.raises(brooq.InvalidJob, match=r"above the limit of 100"):
        queue.enqueue(Job("work", "é" * 60))  # 60 characters, 122 bytes
    assert count_jobs(pg) == 0
    queue.enqueue(Job("work", "x" * 98))  # 100 bytes with the quotes
    assert count_jobs(pg) == 1
    queue.close()


def test_default_payload_limit(pg: psycopg.Connection[Any], dsn: str) -> None:
    queue = brooq.Queue(dsn)
    with pytest.raises(brooq.InvalidJob, match="above the limit"):
        queue.enqueue(Job("work", "x" * brooq.vocabulary.DEFAULT_MAX_PAYLOAD_BYTES))
    assert count_jobs(pg) == 0
    queue.close()


BAD_TOPICS = [
    "",
    "Email.send",
    "EMAIL",
    "email send",
    " email",
    "x'; drop table job;--",
    "a" * 129,
    "email..send",
    ".email",
    "email.",
    "email/send",
    "émail",
    "a\x00b",
]


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_invalid_topic_is_rejected(pg: psycopg.Connection[Any], dsn: str, topic: str) -> None:
    queue = brooq.Queue(dsn)
    with pytest.raises(brooq.InvalidTopic, match="topic") as info:
        queue.enqueue(Job(topic, {"x": 1}))
    assert isinstance(info.value, brooq.BrooqError) and isinstance(info.value, ValueError)
    assert len(str(info.value)) < 300
    assert count_jobs(pg) == 0
    assert _one(pg, "SELECT to_regclass('job') IS NOT NULL")
    queue.close()


def test_topic_of_the_wrong_type_is_rejected() -> None:
    with pytest.raises(brooq.InvalidTopic, match="must be a string"):
        Job(123)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key,match",
    [
        ("k" * 513, "above the limit of 512"),
        ("🔑" * 513, "above the limit of 512"),
        ("a\x00b", "NUL"),
        (42, "must be a string"),
    ],
)
def test_invalid_idempotency_key_is_rejected(
    pg: psycopg.Connection[Any], dsn: str, key: Any, match: str
) -> None:
    queue = brooq.Queue(dsn)
    with pytest.raises(brooq.InvalidJob, match=match):
        queue.enqueue(Job("work", idempotency_key=key))
    assert count_jobs(pg) == 0
    queue.close()


def test_longest_key_and_topic_fit_the_index(pg: psycopg.Connection[Any], dsn: str) -> None:
    queue = brooq.Queue(dsn)
    topic, key = "t" * 128, "🔑" * 512  # 2,048 bytes of key
    first = queue.enqueue(Job(topic, idempotency_key=key))
    assert first.created
    assert queue.enqueue(Job(topic, idempotency_key=key)) == (first.id, False)
    assert count_jobs(pg) == 1
    queue.close()


@pytest.mark.parametrize(
    "available_at,match",
    [
        (datetime(2030, 1, 1), "timezone-aware"),
        ("2030-01-01T00:00:00Z", "must be a datetime"),
        (1_900_000_000, "must be a datetime"),
    ],
)
def test_invalid_available_at_is_rejected(
    pg: psycopg.Connection[Any], dsn: str, available_at: Any, match: str
) -> None:
    queue = brooq.Queue(dsn)
    with pytest.raises(brooq.InvalidJob, match=match):
        queue.enqueue(Job("work", available_at=available_at))
    assert count_jobs(pg) == 0
    queue.close()


def test_available_at_in_any_timezone_is_the_same_instant(
    pg: psycopg.Connection[Any], dsn: str
) -> None:
    from datetime import timezone

    queue = brooq.Queue(dsn)
    at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=5)))
    job_id, _ = queue.enqueue(Job("work", available_at=at))
    assert queue.get(job_id).available_at == datetime(2030, 1, 1, 7, tzinfo=UTC)
    queue.close()


def test_enqueue_takes_only_jobs(pg: psycopg.Connection[Any], dsn: str) -> None:
    queue = brooq.Queue(dsn)
    with pytest.raises(TypeError, match=r"brooq\.Job"):
        queue.enqueue({"topic": "work"})  # type: ignore[arg-type]
    assert count_jobs(pg) == 0
    queue.close()


# -- an unreachable database -------------------------------------------------------------------

SECRET = "S3cr3t-Pa55"


@pytest.mark.parametrize(
    "dsn_template",
    [
        "postgresql://brooq:{pw}@127.0.0.1:1/brooq?connect_timeout=3",
        "host=127.0.0.1 port=1 user=brooq password={pw} dbname=brooq connect_timeout=3",
        "host=127.0.0.1 port=1 user=brooq password='{pw} with spaces' dbname=brooq "
        "connect_timeout=3",
    ],
    ids=["url", "key-value", "quoted"],
)
def test_unreachable_database_raises_store_unavailable(dsn_template: str) -> None:
    queue = brooq.Queue(dsn_template.format(pw=SECRET))
    calls: list[Callable[[], object]] = [
        lambda: queue.enqueue(Job("work")),
        lambda: queue.get("01890000-0000-7000-8000-000000000000"),
        lambda: queue.cancel("01890000-0000-7000-8000-000000000000"),
        lambda: queue.store.claim("w1", ["work"], LEASE),
    ]
    for call in calls:
        with pytest.raises(brooq.StoreUnavailable) as info:
            call()
        _assert_no_secret(info.value)
    queue.close()


def test_a_broken_connection_raises_store_unavailable_then_reconnects(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    (job,) = pg_store.enqueue_many([Job("work")])
    pg.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'"
    )
    assert _wait_backends(pg, 0) == 0
    with pytest.raises(brooq.StoreUnavailable, match="database unavailable"):
        pg_store.claim("w1", ["work"], LEASE)
    claimed = pg_store.claim("w1", ["work"], LEASE)  # a fresh connection
    assert claimed is not None and claimed.id == job.id


def test_wrong_password_raises_store_unavailable_without_it(dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["password"] = SECRET
    queue = brooq.Queue(psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()}))
    with pytest.raises(brooq.StoreUnavailable, match="authentication") as info:
        queue.enqueue(Job("work"))
    _assert_no_secret(info.value)
    queue.close()


def _assert_no_secret(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert SECRET not in str(exc) and SECRET not in repr(exc)
    assert SECRET not in text
    assert str(exc).startswith("database unavailable")


@pytest.fixture
def direct() -> Iterator[None]:
    """This process connects directly (a test through a bouncer may have left its profile
    on PgBouncer's), as it was afterwards."""
    from brooq.postgres.connect import PROFILE, use_pgbouncer

    before = PROFILE.pgbouncer
    use_pgbouncer(False)
    try:
        yield
    finally:
        use_pgbouncer(before)


def test_no_connection_brooq_opens_compiles_its_statements(dsn: str, direct: None) -> None:
    """JIT is off on the supervisor's stores and on a Queue's own connection: once the
    job table holds a million rows, the estimated cost of a generic claim passes
    jit_above_cost, and compiling then took 100 ms a claim (5,000 jobs/s instead of 14,000)."""
    from brooq.config.sources import load_settings
    from brooq.supervisor.services import open_stores

    writes, claims = open_stores(load_settings(environ={}, env_file=None), dsn)
    try:
        for store in (writes, claims):
            with store.connector.connection() as conn:
                assert _one(conn, "SHOW jit") == "off"
    finally:
        writes.close()
        claims.close()
    store = PostgresStore(dsn)  # a Queue's
    try:
        with store.connector.connection() as conn:
            assert _one(conn, "SHOW jit") == "off"
    finally:
        store.close()


def test_a_claims_lane_runs_generic_plans_and_a_limited_claim_does_not(
    pg: psycopg.Connection[Any], dsn: str
) -> None:
    """The supervisor's claims store plans its prepared claims once (plan_cache_mode on its
    own session); a claim under lock_topic (max_running, rate limits) is planned for its
    parameters, as before, in its transaction only; any other store is left as it is."""
    from brooq.config.sources import load_settings
    from brooq.postgres.sql import sql
    from brooq.supervisor.services import open_stores

    writes, claims = open_stores(load_settings(environ={}, env_file=None), dsn)
    try:
        with claims.connector.connection() as conn:
            assert _one(conn, "SHOW plan_cache_mode") == "force_generic_plan"
            with conn.transaction():
                conn.execute(sql("lock_topic"), {"topic": "t"})
                assert _one(conn, "SHOW plan_cache_mode") == "auto"
            assert _one(conn, "SHOW plan_cache_mode") == "force_generic_plan"
        with writes.connector.connection() as conn:
            assert _one(conn, "SHOW plan_cache_mode") == "auto"
        pg.execute("INSERT INTO job (topic, payload) VALUES ('t', '1')")
        claimed = claims.claim_many("h:1:x", ["t"], timedelta(seconds=30), 5)
        assert [c.payload for c in claimed] == [1]
    finally:
        writes.close()
        claims.close()
