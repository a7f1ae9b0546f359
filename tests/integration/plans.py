"""Reading EXPLAIN plans of statements on the partitioned job table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg


def nodes(plan: dict[str, Any], bounded: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every plan node, with whether a Limit above it bounds the rows it yields."""
    yield plan, bounded
    below = bounded or plan["Node Type"] == "Limit"
    for child in plan.get("Plans", []):
        yield from nodes(child, below)


class Layout:
    """job's partitions and the partitions of its indexes, read from the catalog."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT c.relname, c.relpages FROM pg_inherits i JOIN pg_class c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = 'job'::regclass"
        ).fetchall()
        self.partitions = {r[0] for r in rows} | {"job"}
        self.filled = {r[0] for r in rows if r[1] > 0}
        """Partitions holding pages (an empty one is scanned for free, whatever the plan)."""
        self.index_of = {
            r[0]: r[1]
            for r in conn.execute(
                "SELECT c.relname, p.relname FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
                "WHERE p.relname IN ('job_claim_idx', 'job_pkey', 'job_terminal_idx', "
                "'job_processing_idx', 'job_rate_key_idx', 'job_ready_xid_idx')"
            )
        }
        """Each partition's index → the index of job it is a partition of."""

    def full_scans(self, plan: dict[str, Any]) -> list[dict[str, Any]]:
        """Seq scans of partitions that hold rows."""
        return [
            n
            for n, _ in nodes(plan)
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in self.filled
        ]

    def unbounded_sorts(self, plan: dict[str, Any]) -> list[dict[str, Any]]:
        """Sorts over job rows that no Limit below them cuts (a Sort of heads is fine, and
        so is one over empty partitions only: it sorts nothing)."""
        out = []
        for node, _ in nodes(plan):
            if node["Node Type"] in ("Sort", "Incremental Sort"):
                for inner, bounded in nodes(node):
                    if inner.get("Relation Name") in self.filled | {"job"} and not bounded:
                        out.append(node)
        return out

    def index_scans(self, plan: dict[str, Any], of: str) -> list[dict[str, Any]]:
        """Index scans (plain or index-only) through a partition of job's index ``of``."""
        return [
            n
            for n, _ in nodes(plan)
            if n["Node Type"] in ("Index Scan", "Index Only Scan")
            and self.index_of.get(n.get("Index Name", "")) == of
        ]

    def relations(self, plan: dict[str, Any], alias: str | None = None) -> set[str]:
        """The partitions of job the plan reads (under ``alias`` only, when given: a
        statement that also reads other rows of job names them otherwise)."""
        return {
            n["Relation Name"]
            for n, _ in nodes(plan)
            if n.get("Relation Name") in self.partitions - {"job"}
            and (alias is None or n.get("Alias", "").rsplit("_", 1)[0] == alias)
        }


def explain(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> dict[str, Any]:
    """The top plan node of ``statement`` (not run)."""
    row = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]
