"""Middleware in the worker processes of a real ``brooq supervise``: it wraps sync and async
handlers alike, and an exception it raises fails that attempt, never the worker."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.system.harness import insert_jobs, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]


@pytest.mark.timeout(60)
def test_middleware_wraps_handlers_in_the_workers_and_its_errors_fail_only_the_attempt(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "1", "--http-addr", "127.0.0.1:0", app="sysapp_middleware:queue")
    (worker,) = sup.wait_children(1, timeout=30)
    refused = insert_jobs(pg, "plain", [{"tenant": "t0", "refuse": True}])
    plain = insert_jobs(pg, "plain", [{"tenant": "t1"}])
    coro = insert_jobs(pg, "coro", [{"tenant": "t2"}])
    ids = refused + plain + coro

    def rows() -> dict[str, tuple[Any, ...]]:
        found = pg.execute(
            "SELECT id::text, state, result, last_error FROM job WHERE id = ANY(%s::uuid[])",
            (ids,),
        )
        return {r[0]: r[1:] for r in found}

    wait_until(
        lambda: all(r[0] in ("done", "dead") for r in rows().values()), 30, "every job ended"
    )
    got = rows()
    assert got[refused[0]][0] == "dead"
    assert got[refused[0]][2] == "PermissionError: tenant t0 is suspended"
    assert got[plain[0]][:2] == ("done", {"tenant": "t1", "pid": worker})
    assert got[coro[0]][:2] == ("done", {"tenant": "t2", "pid": worker})
    assert sup.children() == [worker]  # the same worker ran all three
    assert not sup.events("WorkerExited")
