"""A fleet: 10 supervisors x 2 workers, separate process trees, through one PgBouncer.

Each supervisor is its own ``brooq supervise`` (its own holder identity), all
with DATABASE_URL at one PgBouncer in transaction mode whose server pool is 8
connections. They drain jobs whose handler writes an effect (``on_succeeded``:
a row in ``handled``, no unique constraint, so a double would show); three
supervisors are killed with SIGKILL at random moments. At the end every job is
``done``, each effect is there exactly once, no row is ``processing``, and the
server connections, polled all along (SHOW POOLS and pg_stat_activity), never
exceeded the pool.

Size: FLEET_SIZE=full (``make fleet``) or CHAOS_SIZE=full drains 20,000 jobs;
the default (CI) 4,000 (~20 s). FLEET_REPORT=path writes the measurements as
JSON (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.system.bouncer import PgBouncer
from tests.system.harness import Supervisor, count, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

SUPERVISORS = 10
WORKERS = 2
POOL = 8
KILLS = 3
FULL = "full" in (os.environ.get("FLEET_SIZE"), os.environ.get("CHAOS_SIZE"))
JOBS = 20_000 if FULL else 4_000
LEASE = "3s"


@pytest.fixture
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    b = PgBouncer(server_url, pool_size=POOL, max_clients=200).start()
    try:
        yield b
    finally:
        b.stop()


class Watch(threading.Thread):
    """Polls the server connections of the test database every 50 ms: the peak of each view."""

    def __init__(self, bouncer: PgBouncer, dsn: str, ours: int) -> None:
        super().__init__(daemon=True)
        self.bouncer, self.dsn, self.ours = bouncer, dsn, ours
        self.dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
        self.peak_pools = self.peak_backends = self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid NOT IN (pg_backend_pid(), %s) AND backend_type = 'client backend'",
                    (self.ours,),
                ).fetchone()
                assert row is not None
                self.peak_backends = max(self.peak_backends, int(row[0]))
                self.peak_pools = max(self.peak_pools, self.bouncer.server_connections(self.dbname))
                self.samples += 1


@pytest.mark.timeout(240 if JOBS > 4_000 else 120)
def test_ten_supervisors_through_one_bouncer_lose_nothing_when_three_are_killed(
    pg: psycopg.Connection[Any],
    bouncer: PgBouncer,
    dsn: str,
    tmp_path: Any,
    request: pytest.FixtureRequest,
) -> None:
    from tests.system.conftest import SUPERVISORS as STASH

    pg.execute("CREATE TABLE handled (job_id uuid NOT NULL)")
    pg.execute(
        "INSERT INTO job (topic, payload) SELECT 'work', '{\"record\": true}'::jsonb "
        "FROM generate_series(1, %s)",
        (JOBS,),
    )
    env = {
        "QUEUE_PGBOUNCER": "true",
        "QUEUE_LEASE": LEASE,
        "QUEUE_POLL_INTERVAL": "200ms",
        "QUEUE_GRACEFUL_TIMEOUT": "3s",
        "LOG_LEVEL": "warning",
    }
    fleet = [
        Supervisor(
            bouncer.url(dsn), tmp_path, args=("--workers", str(WORKERS)), env=env, name=f"fleet{n}"
        )
        for n in range(SUPERVISORS)
    ]
    request.node.stash[STASH] = fleet
    watch = Watch(bouncer, dsn, pg.info.backend_pid)  # not the test's own connection
    watch.start()
    rng = random.Random(os.environ.get("FLEET_SEED"))
    kill_at = sorted(rng.uniform(0.1, 0.8) for _ in range(KILLS))
    killed: list[Supervisor] = []
    try:
        started = time.monotonic()
        for sup in fleet:
            sup.start()

        def progress() -> bool:
            done = count(pg, "state = 'done'")
            while kill_at and done >= kill_at[0] * JOBS:
                kill_at.pop(0)
                victim = rng.choice([s for s in fleet if s not in killed])
                victim.send(signal.SIGKILL)
                killed.append(victim)
            return done == JOBS

        wait_until(progress, 200 if JOBS > 4_000 else 100, f"{JOBS} jobs done", interval=0.1)
        elapsed = time.monotonic() - started
    finally:
        watch.stop.set()
        watch.join(5)
        for sup in fleet:
            sup.stop(timeout=10)

    assert len(killed) == KILLS
    assert count(pg, "state = 'processing'") == 0
    assert count(pg, "state <> 'done'") == 0
    effects = pg.execute("SELECT count(*), count(DISTINCT job_id) FROM handled").fetchone()
    assert effects == (JOBS, JOBS), "each effect exactly once"
    assert count(pg, "job.id NOT IN (SELECT job_id FROM handled)") == 0
    holders = pg.execute("SELECT count(DISTINCT split_part(locked_by, ':', 2)) FROM job").fetchone()
    assert holders is not None and holders[0] >= SUPERVISORS - KILLS
    requeued = count(pg, "attempts > 1")
    assert watch.samples > 10
    assert watch.peak_pools <= POOL, watch.peak_pools
    assert watch.peak_backends <= POOL, watch.peak_backends
    report = {
        "jobs": JOBS,
        "supervisors": SUPERVISORS,
        "workers": WORKERS,
        "pool": POOL,
        "killed": KILLS,
        "seconds": round(elapsed, 1),
        "jobs_per_s": round(JOBS / elapsed),
        "peak_server_connections_pools": watch.peak_pools,
        "peak_backends": watch.peak_backends,
        "requeued_after_kill": requeued,
        "samples": watch.samples,
    }
    print("fleet:", json.dumps(report))
    if path := os.environ.get("FLEET_REPORT"):
        with open(path, "w") as f:
            json.dump(report, f)
