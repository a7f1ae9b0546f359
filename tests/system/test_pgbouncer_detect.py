"""A transaction-pooling PgBouncer without ``QUEUE_PGBOUNCER`` (issue 22, item 17).

Before: the supervisor logged ``DatabaseUnavailable … unsupported startup parameter:
options`` once a minute and never drained; ``brooq status`` ended in an internal error
(``DuplicatePreparedStatement``). A bouncer gives itself away by those two errors: brooq
now switches to its PgBouncer profile and says so once, or (when a statement already
failed) stops with an error that names ``QUEUE_PGBOUNCER``. Real PgBouncer (Debian's),
real processes; every wait bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

import brooq
from brooq.postgres.connect import PROFILE, Connector, use_pgbouncer
from brooq.vocabulary import StoreUnavailable
from tests.system.bouncer import PgBouncer
from tests.system.harness import count, insert_jobs, run_cli, states, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]


class LenientBouncer(PgBouncer):
    """A bouncer told to ignore the ``options`` startup parameter: only the prepared
    statements of other clients give it away (one server connection, so they collide)."""

    def config(self) -> str:
        return (
            super()
            .config()
            .replace(
                "ignore_startup_parameters = extra_float_digits",
                "ignore_startup_parameters = extra_float_digits,options",
            )
        )


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    b = PgBouncer(server_url, pool_size=4).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def profile_restored() -> Iterator[None]:
    """This process's connection profile as it was (a detection switches it)."""
    before = PROFILE.pgbouncer
    try:
        yield
    finally:
        use_pgbouncer(before)


@pytest.mark.timeout(90)
def test_supervise_detects_the_bouncer_says_so_once_and_drains(
    pg: psycopg.Connection[Any], supervise: Any, bouncer: PgBouncer, dsn: str
) -> None:
    total = 200
    sup = supervise(
        "--workers",
        "2",
        "--poll-interval",
        "200ms",
        "--graceful-timeout",
        "3s",
        env={"DATABASE_URL": bouncer.url(dsn)},  # no QUEUE_PGBOUNCER
    )
    sup.wait_children(2)
    insert_jobs(pg, "work", [{}] * total)
    wait_until(lambda: count(pg, "state = 'done'") == total, 60, "every job done", interval=0.2)
    assert states(pg) == {"done": total}
    detected = sup.events("PgBouncerDetected")
    assert len(detected) == 1, sup.log_tail()
    assert "QUEUE_PGBOUNCER" in detected[0]["msg"]
    assert not sup.events("DatabaseUnavailable")
    # The bouncer refused jit=off with the other startup options, and the role has it on.
    (jit,) = sup.events("JitOn")
    assert "ALTER ROLE <role> SET jit = off" in jit["note"]
    assert sup.stop() == 0


def test_jit_is_found_on_through_the_bouncer_until_the_role_or_database_turns_it_off(
    pg: psycopg.Connection[Any], bouncer: PgBouncer, dsn: str, profile_restored: None
) -> None:
    from brooq.postgres.preflight import jit_left_on

    use_pgbouncer(False)
    assert not jit_left_on(dsn)  # direct: the startup option turns it off
    use_pgbouncer(True)
    assert jit_left_on(bouncer.url(dsn))
    database = pg.execute("SELECT current_database()").fetchone()
    assert database is not None
    pg.execute(pgsql.SQL("ALTER DATABASE {} SET jit = off").format(pgsql.Identifier(database[0])))
    with bouncer.admin() as console:  # new server connections, which read the setting
        console.execute(f"RECONNECT {database[0]}")
    assert not jit_left_on(bouncer.url(dsn))


def test_cli_commands_detect_the_bouncer_and_work(
    pg: psycopg.Connection[Any], bouncer: PgBouncer, dsn: str, tmp_path: Path
) -> None:
    via = bouncer.url(dsn)
    insert_jobs(pg, "work", [{}] * 3)
    for argv in (
        ["status"],
        ["workers"],
        ["jobs", "list"],
        ["enqueue", "--topic", "work", "--payload", "{}"],
        ["jobs", "cancel", "--topic", "work"],
    ):
        done = run_cli(via, tmp_path, *argv)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        assert done.stderr.count("QUEUE_PGBOUNCER") == 1, done.stderr
        assert "internal error" not in done.stderr
    assert states(pg) == {"canceled": 4}


@pytest.mark.timeout(60)
def test_another_clients_prepared_statement_gives_the_bouncer_away(
    server_url: str, dsn: str, profile_restored: None
) -> None:
    lenient = LenientBouncer(server_url, pool_size=1).start()
    try:
        via = lenient.url(dsn)
        use_pgbouncer(False)
        first, second = Connector(via), Connector(via)
        try:
            # psycopg prepares a statement at its 5th run: the first client's lands as
            # _pg3_0 on the one server connection; the second's would be _pg3_0 too.
            for _ in range(6):
                with first.connection() as conn:
                    conn.execute("SELECT 1").fetchone()
            with pytest.raises(StoreUnavailable, match="QUEUE_PGBOUNCER"):
                for _ in range(6):
                    with second.connection() as conn:
                        conn.execute("SELECT 2").fetchone()
            assert PROFILE.pgbouncer  # switched, once
            for _ in range(10):  # and from now on it works: nothing is prepared
                with second.connection() as conn:
                    assert conn.execute("SELECT 2").fetchone() == (2,)
        finally:
            first.close()
            second.close()
    finally:
        lenient.stop()


def not_linked(bouncer: PgBouncer) -> int:
    """Lines of the bouncer's log where a notification reached a server connection that no
    client held: a LISTEN that went through the transaction pooler, its notifications lost."""
    log = bouncer.dir / "pgbouncer.log"
    return log.read_text().count("when not linked") if log.exists() else 0


def enqueue_notified(dsn: str, n: int) -> list[str]:
    """``n`` jobs of topic ``work``, one statement each, each with its NOTIFY brooq_job."""
    queue = brooq.Queue(dsn)
    try:
        return [queue.enqueue(brooq.Job("work", {})).id for _ in range(n)]
    finally:
        queue.close()


@pytest.fixture
def own_bouncer(server_url: str) -> Iterator[PgBouncer]:
    """A bouncer of this test alone: its log counts only this test's traffic."""
    b = PgBouncer(server_url, pool_size=4).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.mark.timeout(90)
def test_a_detected_bouncer_is_never_listened_through(
    pg: psycopg.Connection[Any], supervise: Any, own_bouncer: PgBouncer, dsn: str
) -> None:
    # Issue 32, item 8: detected without QUEUE_PGBOUNCER, the supervisor still LISTENed
    # through the transaction pooler, whose log showed the notifications lost ("got
    # packet 'A' from server when not linked": 19 for 10 enqueues), and nothing said so.
    sup = supervise(
        "--workers",
        "2",
        "--poll-interval",
        "300ms",
        env={"DATABASE_URL": own_bouncer.url(dsn)},  # no QUEUE_PGBOUNCER, no QUEUE_LISTEN_URL
    )
    sup.wait_children(2)
    sup.wait_event("PgBouncerDetected", 20)
    off = sup.wait_event("ListenOff", 20)
    assert "QUEUE_LISTEN_URL" in off["note"], off
    ids = enqueue_notified(dsn, 10)
    wait_until(lambda: count(pg, "state = 'done'") == len(ids), 30, "the 10 jobs done (polled)")
    time.sleep(0.5)  # a notification lost would be logged by now
    assert not_linked(own_bouncer) == 0, own_bouncer.log_tail()
    assert not sup.events("ListenLost")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_a_detected_bouncer_listens_on_queue_listen_url_as_with_the_flag(
    pg: psycopg.Connection[Any], supervise: Any, own_bouncer: PgBouncer, dsn: str
) -> None:
    # With QUEUE_LISTEN_URL (direct), detection gives the profile of QUEUE_PGBOUNCER=true:
    # LISTEN there, never through the pooler; a job is taken at once, not at the next poll.
    sup = supervise(
        "--workers",
        "1",
        "--poll-interval",
        "20s",
        env={"DATABASE_URL": own_bouncer.url(dsn), "QUEUE_LISTEN_URL": dsn},
    )
    sup.wait_children(1)
    sup.wait_event("PgBouncerDetected", 20)
    time.sleep(1.0)  # the supervisor's first look for jobs is over: the next one is in 20 s
    started = time.monotonic()
    enqueue_notified(dsn, 1)
    wait_until(lambda: count(pg, "state = 'done'") == 1, 10, "the job done, woken by NOTIFY")
    assert time.monotonic() - started < 5
    assert not_linked(own_bouncer) == 0, own_bouncer.log_tail()
    assert not sup.events("ListenOff")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_brooq_work_stops_listening_once_it_detects_the_bouncer(
    pg: psycopg.Connection[Any], own_bouncer: PgBouncer, dsn: str, tmp_path: Path
) -> None:
    # `brooq work` LISTENs twice (new jobs; cancels of its running job): the same rule.
    enqueue_notified(dsn, 3)
    done = run_cli(
        own_bouncer.url(dsn),
        tmp_path,
        "work",
        "--app",
        "sysapp:queue",
        "--exit-when-idle",
        "--poll-interval",
        "200ms",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert states(pg) == {"done": 3}
    assert done.stderr.count("ListenOff") == 1, done.stderr
    enqueue_notified(dsn, 2)  # nobody listens now: nothing for the bouncer to drop either
    time.sleep(0.5)
    assert not_linked(own_bouncer) == 0, own_bouncer.log_tail()
