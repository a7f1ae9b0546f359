"""The fair claim (fair_walk, fair_more, claim_fair_turns) stays index scans on a large queue
with many keys: the keys are walked on job_rate_key_idx from the cursor, each key's oldest
rows read on it, jobs without a key on job_claim_idx; no Seq Scan, no bitmap scan of job, no
Sort of the table; and a claim of n visits at most n keys, whatever the number ready."""

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


def params(max_running: int | None = None) -> dict[str, Any]:
    """A fair claim's parameters (as limited.py gives them)."""
    return {
        "holder": "w1",
        "lease": timedelta(seconds=30),
        "topic": "api",
        "limit": 16,
        "max_running": max_running,
        "app_version": "v1",
        "fair_keys": ["big"],
        "fair_weights": [4],
        "unkeyed_window": 1000,
        "most_weight": 1000,
        "priority": 2,
        "keys": ["big", "tenant-7", ""],
        "skips": [4, 1, 0],
        "takes": [8, 2, 2],
    }


@pytest.mark.parametrize("name", ["fair_walk", "fair_more"])
def test_the_fair_claim_reads_indexes_only(many_keys: psycopg.Connection[Any], name: str) -> None:
    plan = explain(many_keys, sql(name), params())
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


@pytest.mark.parametrize("max_running", [None, 50])
def test_the_fair_claim_locks_only_what_it_chose(
    many_keys: psycopg.Connection[Any], max_running: int | None
) -> None:
    ids = [r[0] for r in many_keys.execute("SELECT id FROM job LIMIT 3").fetchall()]
    chosen = {"ids": ids, "keys": ["a", "b", "c"], "rounds": [0, 0, 0], "bases": [0, 0, 0]}
    plan = explain(many_keys, sql("claim_fair_turns"), {**params(max_running), **chosen})
    layout = Layout(many_keys)
    assert not layout.full_scans(plan), layout.full_scans(plan)
    assert layout.index_scans(plan, "job_pkey"), "the chosen rows not joined by the primary key"
    assert many_keys.execute("SELECT count(*) FROM job WHERE state = 'pending'").fetchone() == (
        ROWS,
    ), "EXPLAIN must not have claimed anything"


def test_a_claim_of_n_visits_at_most_n_keys(many_keys: psycopg.Connection[Any]) -> None:
    with many_keys.transaction(force_rollback=True):
        many_keys.execute(sql("lock_topic"), {"topic": "api"})
        walked = many_keys.execute(sql("fair_walk"), params()).fetchall()
    assert {r[8] for r in walked} == {16}, "the walk did not stop at 16 keys"
    keys = dict(sorted((r[1], r[0]) for r in walked))
    assert len(keys) == 16 and len(walked) == 4 + 15, walked  # big weighs 4: its 4 jobs
    # From the first key at the highest priority ready (2) in key order: '' comes last.
    assert [keys[0], keys[1]] == ["big", "tenant-1"], keys
