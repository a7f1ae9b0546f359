"""Claim cost on a deep queue: 1,000,000 ready rows, and 10,000 for comparison.

A fresh database is bulk-loaded with ``generate_series`` (ids from the column
default, UUIDv7), then ANALYZEd. ``EXPLAIN (FORMAT JSON)`` of brooq's
``claim_topic`` must show an Index Scan on ``job_claim_idx`` (the plan's top
node and the claim's scan node are printed). Then one autocommit connection
runs ``claim_topic`` 2,000 times, each timed on its own: that includes its
commit (one WAL flush), which on a small queue is most of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.harness import TOPIC, Context, percentile

GROUP = "claim cost (one connection, autocommit, each claim timed)"
LOAD = (
    "INSERT INTO job (topic, payload, available_at) "
    "SELECT %(topic)s, jsonb_build_object('i', i), "
    "       now() - make_interval(secs => (%(n)s - i) / 1000.0) "
    "FROM generate_series(1, %(n)s) AS i"
)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _describe(node: dict[str, Any]) -> str:
    text = str(node["Node Type"])
    if "Index Name" in node:
        text += f" using {node['Index Name']}"
    if "Relation Name" in node:
        text += f" on {node['Relation Name']}"
    return text


def plan_of_claim(conn: psycopg.Connection[Any], params: dict[str, Any]) -> dict[str, Any]:
    """The claim's plan: its top node, its scan node, and whether that is job_claim_idx."""
    from brooq.postgres.sql import sql

    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql("claim_topic"), params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    # job is partitioned: each partition scans its own copy of job_claim_idx.
    claim_indexes = {"job_claim_idx"} | {
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'job_claim_idx'::regclass"
        )
    }
    claim_scan = next((n for n in _nodes(plan) if n.get("Index Name") in claim_indexes), None)
    return {
        "top": _describe(plan),
        "claim_scan": _describe(claim_scan) if claim_scan else "none on job_claim_idx",
        "uses_job_claim_idx": bool(
            claim_scan and claim_scan["Node Type"] in ("Index Scan", "Index Only Scan")
        ),
        "nodes": [_describe(n) for n in _nodes(plan)],
    }


def measure(dsn: str, rows: int, claims: int) -> tuple[dict[str, Any], list[float], float]:
    """Load ``rows``, plan the claim, time ``claims`` claims; (plan, ms each, load seconds)."""
    from brooq.postgres.sql import sql

    params = {
        "holder": "bench:claim",
        "lease": timedelta(minutes=5),
        "topic": TOPIC,
        "limit": 1,
        "app_version": None,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(LOAD, {"topic": TOPIC, "n": rows})
        conn.execute("ANALYZE job")
        loaded = time.perf_counter() - started
        plan = plan_of_claim(conn, params)
        statement, timings = sql("claim_topic"), []
        for _ in range(claims):
            t0 = time.perf_counter()
            row = conn.execute(statement, params).fetchone()
            timings.append((time.perf_counter() - t0) * 1000)
            if row is None:
                raise RuntimeError("the claim found nothing on a full queue")
    return plan, timings, loaded


def run_round(ctx: Context, round_no: int) -> None:
    """The deep queue and the shallow one, order rotated per round."""
    sizes = ctx.sizes
    depths = [sizes.claim_rows, sizes.claim_baseline_rows]
    for rows in depths if round_no % 2 == 0 else depths[::-1]:

        def one(rows: int = rows) -> None:
            with ctx.server.fresh(f"claim{rows}") as dsn:
                plan, ms, loaded = measure(dsn, rows, sizes.claims)
            tag = f"{rows:,} ready rows"
            key = f"claim.rows{rows}"
            for name, value in (
                ("p50", percentile(ms, 50)),
                ("p99", percentile(ms, 99)),
                ("mean", sum(ms) / len(ms)),
            ):
                ctx.results.add(
                    f"{key}.{name}",
                    value,
                    round_no=round_no,
                    group=GROUP,
                    label=f"{tag}: claim {name}",
                    unit="ms",
                    higher_is_better=False,
                )
            ctx.results.notes[f"claim plan at {tag}"] = (
                f"top node: {plan['top']}; claim scan: {plan['claim_scan']}; "
                f"index scan on job_claim_idx: {'yes' if plan['uses_job_claim_idx'] else 'NO'}; "
                f"plan: {' > '.join(plan['nodes'])}; bulk load + ANALYZE took {loaded:.1f}s"
            )
            if not plan["uses_job_claim_idx"]:
                raise RuntimeError(f"the claim at {tag} does not use job_claim_idx: {plan}")

        ctx.guarded(f"round {round_no + 1} claim_cost {rows}", one)
