"""Every named statement that reads job, planned on a million rows over daily partitions.

The claims read the ready rows of each partition through its part of job_claim_idx,
merged in claim order (no Seq Scan, no Sort of the table); a statement that names an
id reads one partition; the fenced settles, heartbeats and releases join by the primary
key; maintenance reads only through its partial indexes. Statements that do not read
job are listed with why they are not planned here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from brooq.postgres.enqueue import control_params
from brooq.postgres.floors import START
from brooq.postgres.sql import statements
from brooq.vocabulary import Job
from tests.integration.partitions import past_layout
from tests.integration.plans import Layout, explain, nodes

pytestmark = pytest.mark.db

ROWS = 1_000_000
FRESH = 3_000  # rows of the last five minutes, for the look of claim_floors
UUID7_AT_T = (
    "encode(substring(int8send((extract(epoch FROM t) * 1000)::bigint) FROM 3) "
    "|| substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid"
)
"""A UUIDv7 id made at time ``t`` (brooq's ids; the partition is chosen by it)."""
DAYS = 10
TOPICS = ["email.send", "report.daily", "image.resize"]

NOT_ON_JOB = {
    "listen_jobs": "LISTEN",
    "listen_cancels": "LISTEN",
    "listen_done": "LISTEN",
    "listen_pauses": "LISTEN",
    "pause_topic": "brooq_topic_pause",
    "resume_topic": "brooq_topic_pause",
    "topic_pauses": "brooq_topic_pause",
    "paused_topic_names": "brooq_topic_pause",
    "ping": "SELECT 1",
    "lock_topic": "an advisory lock and set_config",
    "lock_fair_topic": "an advisory lock and set_config",
    "terminate_cut_backends": "pg_stat_activity",
    "limit_statement_time": "set_config",
    "limit_idle_time": "set_config",
    "register_supervisor": "brooq_supervisor",
    "expire_supervisors": "brooq_supervisor",
    "unregister_supervisor": "brooq_supervisor",
    "supervisors": "brooq_supervisor",
    "connection_room": "pg_stat_activity",
    "schema_facts": "the catalog",
    "yoyo_table_exists": "the catalog",
    "yoyo_applied_ids": "_yoyo_migration",
    "tables_without_dml": "the catalog",
    "add_partitions": "a function: DDL, planned by the function itself",
    "drop_partition": "a function: DDL, planned by the function itself",
    "partitions": "the catalog and statistics",
    "copy_jobs": "COPY: no plan, it inserts what it is sent",
    "copy_jobs_plain": "COPY: no plan, it inserts what it is sent",
    "copy_jobs_at": "COPY: no plan, it inserts what it is sent",
    "notify_topics": "pg_notify",
}
CLAIMS = {"claim_topic", "claim_topics", "claim_topic_limited", "fair_walk", "claim_levels",
          "claim_floors"}  # fmt: skip
BY_ID = {"settle", "get", "cancel"}
BY_PRIMARY_KEY = {
    "settle_many",
    "heartbeat",
    "release",
    "enqueue_one",
    "enqueue_many",
    "enqueue_graph",
    "parent_states",
    "retry_picked",
    "claim_fair_turns",
}
RESOLVES = {"settle", "settle_many", "cancel", "cancel_jobs", "cancel_workflow", "requeue_expired"}
"""Statements that end jobs and resolve their children's edges (resolve_children): they read
children by id too, under other aliases (c, child), never by a scan."""
OPERATOR_SCANS = {
    "depth": "counts every row by topic and state: a whole read by design (bounded by the "
    "operator reads' statement timeout)",
    "count_jobs": "an operator's filter of any shape; bounded by the statement timeout",
    "list_jobs": "an operator's filter of any shape, newest first; bounded likewise",
    "retry_pick": "an operator's filter, a batch at a time",
    "cancel_jobs": "an operator's filter, a batch at a time",
    "count_cancelable": "what an operator's bulk cancel left, counted once after its batches",
    "purge_jobs": "an operator's filter, a batch at a time",
    "retarget_jobs": "an operator's filter, a batch at a time",
    "count_retargetable": "an operator's filter (a retarget's dry run); bounded likewise",
    "pending_by_version": "counts the rows not started yet by topic and version, as depth",
}


TYPES = {
    "id": "uuid", "holder": "text", "attempt": "int", "state": "text", "refund": "int",
    "retry_in": "interval", "error": "text", "traceback": "text", "reason": "text",
    "result": "text", "window": "interval",
    "ids": "uuid[]", "holders": "text[]", "attempts": "int[]", "lease": "interval",
    "outcomes": "text", "app_version": "text", "limit": "int", "topic": "text",
    "topics": "text[]", "max_running": "int", "seen": "text[]", "everywhere": "bool",
    "floor_topics": "text[]", "levels": "smallint[]", "ats": "timestamptz[]",
}  # fmt: skip
"""The parameters' types for PREPARE (psycopg says them when it prepares)."""


@pytest.fixture(scope="module")
def million(admin: psycopg.Connection[Any], server_url: str, template_db: str) -> Iterator[str]:
    """A migrated database of its own: 1,000,000 rows over daily partitions of the past 10
    days (95% terminal, 3% pending, 1% failed, 1% processing; half keyed), analyzed.

    The rows end at today's midnight (UTC), not now: today's partition stays empty whatever
    the hour. Ending at now left it a few hundred rows just after midnight, which the
    planner rightly reads whole, and the plans depended on the time of day."""
    from tests.conftest import _with_db

    name = f"{template_db}_plans"
    admin.execute(
        pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
    )
    admin.execute(
        pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            pgsql.Identifier(name), pgsql.Identifier(template_db)
        )
    )
    dsn = _with_db(server_url, name)
    with psycopg.connect(dsn, autocommit=True) as pg:
        past_layout(pg, DAYS)
        seconds = DAYS * 86400 * 0.95 / ROWS
        pg.execute(
            "INSERT INTO job (id, topic, payload, state, attempts, available_at, locked_by, "
            "locked_until, idempotency_key, created_at, updated_at) "
            f"SELECT {UUID7_AT_T}, "
            "       (%(topics)s::text[])[1 + i %% 3], '{}'::jsonb, "
            "       CASE WHEN i %% 100 < 95 THEN (ARRAY['done', 'dead', 'canceled'])[1 + i %% 3] "
            "            WHEN i %% 100 < 98 THEN 'pending' WHEN i %% 100 < 99 THEN 'failed' "
            "            ELSE 'processing' END, "
            "       1, t, CASE WHEN i %% 100 = 99 THEN 'host:1:x' END, "
            "       CASE WHEN i %% 100 = 99 THEN now() + interval '1 minute' END, "
            "       CASE WHEN i %% 2 = 0 THEN 'key-' || i END, t, t "
            "FROM generate_series(1, %(rows)s) AS i, "
            "     LATERAL (SELECT date_trunc('day', now(), 'UTC') "
            "                     - make_interval(secs => i * %(seconds)s)) AS at(t)",
            {"topics": TOPICS, "rows": ROWS, "seconds": seconds},
        )
        pg.execute(
            "INSERT INTO job_key SELECT topic, idempotency_key, id FROM job "
            "WHERE idempotency_key IS NOT NULL"
        )
        pg.execute("ANALYZE job")
        pg.execute("ANALYZE job_key")
    yield dsn
    admin.execute(
        pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
    )


@pytest.fixture(scope="module")
def conn(million: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(million, autocommit=True) as c:
        yield c


def _params(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    ids = [str(r[0]) for r in conn.execute("SELECT id FROM job WHERE state = 'processing' LIMIT 3")]
    now = datetime.now(UTC)
    outcomes = [
        {"id": i, "holder": "host:1:x", "attempt": 1, "state": "done", "refund": 0,
         "retry_s": 0, "error": None, "traceback": None, "result": None}
        for i in ids
    ]  # fmt: skip
    jobs: list[dict[str, Any]] = [
        {"id": f"01a00000-0000-7000-8000-00000000000{n}", "topic": "email.send",
         "payload": {}, "key": f"new-{n}", "at": None, "priority": 0}
        for n in range(3)
    ]  # fmt: skip
    params: dict[str, Any] = {
        "holder": "host:1:x", "lease": timedelta(seconds=30), "limit": 10, "topic": "report.daily",
        "topics": TOPICS, "max_running": 5, "id": ids[0], "attempt": 1, "state": "done",
        "refund": 0, "retry_in": timedelta(0), "error": None, "traceback": None, "result": None,
        "outcomes": json.dumps(outcomes), "ids": ids, "holders": ["host:1:x"] * 3,
        "attempts": [1] * 3, "known": ids[:1], "max_expirations": 5, "batch": 1000,
        "ttl": timedelta(days=3), "grace": timedelta(minutes=10), "reason": None,
        "key_prefix": "key-1%",
        "since": timedelta(hours=1), "window": timedelta(seconds=20),
        "after_at": None, "after_id": None, "until": None, "most": 4,
        "keys": ["key-2", "key-4"], "jobs": json.dumps(jobs), "notify": False,
        "available_at": None, "payload": "{}", "key": "key-2", "priority": 0,
        "app_version": None, "fair": False, "fair_keys": [], "fair_weights": [],
        "unkeyed_window": 1000, "most_weight": 1000, "skips": [0, 3], "takes": [5, 5],
        "rounds": [0, 0, 1], "bases": [0, 0, 0], "from_version": "v1", "to_version": "v2",
        "rate_key": None, "rate": 100, "per": timedelta(seconds=1), "per_us": 1_000_000,
        "burst": 20, "rates": [100], "pers": [timedelta(seconds=1)], "bursts": [20],
        "after": "", "unkeyed": True, "by": "ops",
        **control_params(Job("report.daily")),
        "workflow": None, "edges": json.dumps([{"parent_id": ids[0], "child_id": jobs[0]["id"],
        "parent_state": None}]),
    }  # fmt: skip
    if name == "claim_floors":  # every level of every topic from its start (floors.py)
        row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert row is not None
        params.update(seen=[row[0]] * len(TOPICS), everywhere=False, floor_topics=TOPICS,
                      levels=[0] * len(TOPICS), ats=[START[0]] * len(TOPICS),
                      ids=[START[1]] * len(TOPICS))  # fmt: skip
    if name == "declare_rates":
        params["topics"] = ["report.daily"]
    if name in {"existing_keys", "free_orphan_keys"}:
        params["topics"] = ["report.daily", "email.send"]
    if name in {"list_jobs", "count_jobs", "retry_pick", "cancel_jobs", "count_cancelable",
                "purge_jobs", "retarget_jobs", "count_retargetable"}:  # fmt: skip
        params.update(topics=[], ids=[], since=now - timedelta(hours=1), state=None)
        if name == "retry_pick":
            params["state"] = "dead"
    return params


def test_every_statement_is_planned_or_said_why_not() -> None:
    planned = set(statements()) - set(NOT_ON_JOB)
    assert CLAIMS | BY_ID | BY_PRIMARY_KEY | set(OPERATOR_SCANS) <= planned


@pytest.mark.parametrize("name", sorted(set(statements()) - set(NOT_ON_JOB)))
def test_plan_on_a_million_rows(conn: psycopg.Connection[Any], name: str) -> None:
    layout = Layout(conn)
    assert len(layout.filled) >= DAYS
    plan = explain(conn, statements()[name], _params(conn, name))
    if name in OPERATOR_SCANS:
        return  # planned (it runs), and may read everything: see OPERATOR_SCANS
    assert not layout.full_scans(plan), f"{name} reads a whole partition: {layout.full_scans(plan)}"
    if name in CLAIMS:
        assert not _sorts_of_the_table(layout, plan), f"{name} sorts the table"
        scans = {n["Relation Name"] for n in layout.index_scans(plan, "job_claim_idx")}
        assert scans >= layout.filled, f"{name}: partitions not read through job_claim_idx"
    if name in BY_ID:
        named = layout.relations(plan, "job" if name in RESOLVES else None)
        assert len(named) == 1, f"{name} reads more than the id's partition: {named}"
        assert layout.index_scans(plan, "job_pkey"), name
    if name in BY_PRIMARY_KEY:
        assert layout.index_scans(plan, "job_pkey"), f"{name} does not join by the primary key"


def _sorts_of_the_table(layout: Layout, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Sorts over job rows no Limit cuts, but for those of claim_floors' look: it reads
    only the rows made ready since the previous look (a range of job_ready_xid_idx, alone
    or ANDed with the id bound on job_pkey), and groups them by priority level, as a hash
    or a sort of those few."""

    def look_only(sort: dict[str, Any]) -> bool:
        # By index or by bitmap (the index is then named on the Bitmap Index Scan below).
        under = [n for n, _ in nodes(sort)]
        indexes = {
            layout.index_of[n["Index Name"]]
            for n in under
            if n.get("Index Name") in layout.index_of
        }
        # A custom plan may AND the look's range with the id bound's (job_pkey) bitmap.
        return (
            "job_ready_xid_idx" in indexes
            and indexes <= {"job_ready_xid_idx", "job_pkey"}
            and not layout.full_scans(sort)
        )

    return [s for s in layout.unbounded_sorts(plan) if not look_only(s)]


def _generic_plan(conn: psycopg.Connection[Any], name: str, analyze: bool) -> dict[str, Any]:
    """The top node of ``name``'s generic plan, as psycopg's prepared statements get it
    under plan_cache_mode force_generic_plan; run (and rolled back) when ``analyze``."""
    params = _params(conn, name)
    statement = statements()[name]
    order = sorted(set(re.findall(r"%\((\w+)\)s", statement)))
    for i, p in enumerate(order, start=1):
        statement = statement.replace(f"%({p})s", f"${i}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        types = ", ".join(TYPES[p] for p in order)
        conn.execute(f"PREPARE generic ({types}) AS {statement}")
        args = pgsql.SQL(", ").join(pgsql.Literal(params[p]) for p in order)
        options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
        query = pgsql.SQL("EXPLAIN ({}) EXECUTE generic ({})").format(pgsql.SQL(options), args)
        with conn.transaction(force_rollback=True):
            row = conn.execute(query).fetchone()
        assert row is not None
        return row[0][0]["Plan"]  # type: ignore[no-any-return]
    finally:
        conn.execute("DEALLOCATE ALL")
        conn.execute("RESET plan_cache_mode")


@pytest.mark.parametrize("name", ["settle", "get", "cancel", "heartbeat", "settle_many"])
def test_generic_plans_by_id_read_one_partition_a_row(
    conn: psycopg.Connection[Any], name: str
) -> None:
    """psycopg prepares what it runs often: partitions are then pruned as the plan starts
    (by id) or per joined row (Subplans Removed, or never executed)."""
    plan = _generic_plan(conn, name, analyze=True)
    layout = Layout(conn)
    ran = [
        n
        for n, _ in nodes(plan)
        if n.get("Relation Name") in layout.filled and n.get("Actual Loops", 0) > 0
    ]
    read = {n["Relation Name"] for n in ran}
    # One id (settle, get, cancel) is one partition; three ids at most three.
    assert 1 <= len(read) <= (1 if name in BY_ID else 3), f"{name} read {read}"
    assert all(n["Node Type"] == "Index Scan" for n in ran), f"{name}: {ran}"


@pytest.mark.parametrize(
    "name", ["claim_topic", "claim_topics", "claim_topic_limited", "claim_levels", "claim_floors"]
)
def test_generic_claim_plans_read_each_partition_in_claim_order(
    conn: psycopg.Connection[Any], name: str
) -> None:
    """A supervisor's claims lane runs on generic plans (plan_cache_mode): planned once, a
    claim still reads each partition through job_claim_idx, merged, never a sort of the
    table; the LIMIT and the topic are parameters the plan cannot see."""
    plan = _generic_plan(conn, name, analyze=False)
    layout = Layout(conn)
    assert not layout.full_scans(plan), f"{name} reads a whole partition"
    assert not _sorts_of_the_table(layout, plan), f"{name} sorts the table"
    scans = {n["Relation Name"] for n in layout.index_scans(plan, "job_claim_idx")}
    assert scans >= layout.filled, f"{name}: partitions not read through job_claim_idx"


def test_generic_floors_plan_looks_for_fresh_rows_by_transaction_in_the_newest_partitions(
    conn: psycopg.Connection[Any],
) -> None:
    """claim_floors' look for rows made ready behind a floor reads job_ready_xid_idx (a
    range of transaction ids, not the claim index, whose entries of claimed rows a held
    snapshot keeps), and only in the partitions of the last minutes' ids: the older ones
    are pruned as the plan starts (a sweep's look reads them all)."""
    with conn.transaction(force_rollback=True):
        conn.execute(  # what came in the last minutes, where the look reads
            "INSERT INTO job (id, topic, payload, state, available_at, created_at, updated_at) "
            f"SELECT {UUID7_AT_T}, "
            "       (%(topics)s::text[])[1 + i %% 3], '{}', 'pending', t, t, t "
            "FROM generate_series(1, %(fresh)s) AS i, "
            "     LATERAL (SELECT now() - make_interval(secs => i * 0.1)) AS at(t)",
            {"topics": TOPICS, "fresh": FRESH},
        )
        plan = _generic_plan(conn, "claim_floors", analyze=True)
        layout = Layout(conn)
    looked = {n["Relation Name"] for n in layout.index_scans(plan, "job_ready_xid_idx")}
    assert looked, "the look does not read job_ready_xid_idx"
    ran = {
        n["Relation Name"]
        for n in layout.index_scans(plan, "job_ready_xid_idx")
        if n.get("Actual Loops", 0) > 0
    }
    assert len(ran) <= 1 < len(layout.filled), f"the look read {ran}"
