"""The fair claim (claim_topic_fair) stays index scans on a large queue with many keys: the
keys are walked on job_rate_key_idx, each key's oldest rows read on it, jobs without a key
on job_claim_idx; no Seq Scan, no bitmap scan of job, no Sort of the table."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.postgres.sql import sql
from tests.integration.plans import Layout, explain, nodes

ROWS = 100_000


@pytest.fixture
def many_keys(pg: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """100,000 ready rows of one topic: 90% over 1,000 keys, one big key, a few unkeyed."""
    pg.execute(
        "INSERT INTO job (topic, payload, priority, available_at, rate_key) "
        "SELECT 'api', jsonb_build_object('i', i), (i %% 3), "
        "       now() - make_interval(secs => i / 100.0), "
        "       CASE WHEN i %% 10 = 0 THEN 'big' WHEN i %% 97 = 0 THEN NULL "
        "            ELSE 'tenant-' || (i %% 1000) END "
        "FROM generate_series(1, %s) AS i",
        (ROWS,),
    )
    pg.execute("ANALYZE job")
    return pg


@pytest.mark.parametrize("max_running", [None, 50])
def test_the_fair_claim_reads_indexes_only(
    many_keys: psycopg.Connection[Any], max_running: int | None
) -> None:
    params = {
        "holder": "w1",
        "lease": timedelta(seconds=30),
        "topic": "api",
        "limit": 16,
        "max_running": max_running,
        "app_version": "v1",
        "fair_keys": ["big"],
        "fair_weights": [4],
        "unkeyed_window": 1000,
    }
    plan = explain(many_keys, sql("claim_topic_fair"), params)
    layout = Layout(many_keys)
    assert not layout.full_scans(plan), layout.full_scans(plan)
    bitmaps = [
        n
        for n, _ in nodes(plan)
        if n["Node Type"] == "Bitmap Heap Scan" and n.get("Relation Name") in layout.filled
    ]
    assert not bitmaps, "a bitmap scan reads pages of job's partitions"
    assert not layout.unbounded_sorts(plan), "a Sort over the job table"
    assert layout.index_scans(plan, "job_rate_key_idx"), "keys not walked on job_rate_key_idx"
    assert layout.index_scans(plan, "job_claim_idx"), "unkeyed jobs not read on job_claim_idx"
    assert many_keys.execute("SELECT count(*) FROM job WHERE state = 'pending'").fetchone() == (
        ROWS,
    ), "EXPLAIN must not have claimed anything"
