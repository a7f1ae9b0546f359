"""The claim statements stay index scans on a large queue: no Seq Scan, no Sort of the table."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.postgres.sql import sql
from tests.integration.plans import Layout, explain, nodes

ROWS = 100_000
TOPICS = ["email.send", "report.daily", "image.resize"]
SERVED: dict[str, dict[str, object]] = {
    "claim_topic": {"topic": "report.daily"},
    "claim_topics": {"topics": TOPICS},
}


@pytest.fixture
def big_queue(pg: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """100,000 ready rows across three topics (UUIDv7 ids from the column default), analyzed."""
    pg.execute(
        "INSERT INTO job (topic, payload, available_at) "
        "SELECT (%s::text[])[1 + i %% 3], jsonb_build_object('i', i), "
        "       now() - make_interval(secs => i / 100.0) "
        "FROM generate_series(1, %s) AS i",
        (TOPICS, ROWS),
    )
    pg.execute("ANALYZE job")
    return pg


def _check_plan(conn: psycopg.Connection[Any], plan: dict[str, Any]) -> None:
    layout = Layout(conn)
    assert layout.index_scans(plan, "job_claim_idx"), "the claim does not scan job_claim_idx"
    assert not layout.full_scans(plan), f"full scan of a partition: {layout.full_scans(plan)}"
    assert not [n for n, _ in nodes(plan) if n["Node Type"] == "Bitmap Heap Scan"], "unordered"
    # A Sort may only order per-topic heads, each already cut by a Limit.
    assert not layout.unbounded_sorts(plan), "a Sort over the job table"


@pytest.mark.parametrize("name", sorted(SERVED))
def test_claim_plan_uses_the_claim_index(big_queue: psycopg.Connection[Any], name: str) -> None:
    params = {
        "holder": "w1",
        "lease": timedelta(seconds=30),
        "limit": 10,
        "app_version": "v1",  # a versioned claim filters on the same index scan
        **SERVED[name],
    }
    _check_plan(big_queue, explain(big_queue, sql(name), params))
    assert big_queue.execute("SELECT count(*) FROM job WHERE state = 'pending'").fetchone() == (
        ROWS,
    ), "EXPLAIN must not have claimed anything"


PREPARED = {
    "claim_topic": (
        "text, interval, text, int, text",
        "'w1', '30 seconds', 'report.daily', 10, 'v1'",
    ),
    "claim_topics": (
        "text, interval, text[], int, text",
        "'w1', '30 seconds', ARRAY['email.send', 'report.daily', 'image.resize'], 10, 'v1'",
    ),
}


@pytest.mark.parametrize("name", sorted(SERVED))
def test_generic_plan_uses_the_claim_index(big_queue: psycopg.Connection[Any], name: str) -> None:
    """psycopg prepares a statement it runs often; the generic plan must be as good."""
    types, args = PREPARED[name]
    statement = sql(name)
    names = ("holder", "lease", name.replace("claim_", ""), "limit", "app_version")
    for i, param in enumerate(names, start=1):
        statement = statement.replace(f"%({param})s", f"${i}")
    assert "%(" not in statement
    big_queue.execute("SET plan_cache_mode = force_generic_plan")
    big_queue.execute(f"PREPARE claim_plan ({types}) AS {statement}")
    row = big_queue.execute(f"EXPLAIN (FORMAT JSON) EXECUTE claim_plan ({args})").fetchone()
    assert row is not None
    _check_plan(big_queue, row[0][0]["Plan"])
