"""Every command that touches the job table refuses a database whose migrations are not
this brooq's (behind or ahead), exit 2 with the command to run; ``brooq migrate status``
only reads; :func:`every_migration` is the one list of migrations.

Behind is read from the catalog (each migration's mark), so a database migrated from
Alembic or Django is judged like one ``brooq migrate`` built; ahead from ``brooq
migrate``'s bookkeeping.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.cli import main
from brooq.postgres import migrations
from brooq.postgres.preflight import check_schema
from brooq.postgres.schema import MARKS
from brooq.vocabulary import SchemaBehind, SchemaMismatch, SchemaMissing
from tests.integration.schema import migration_names
from tests.system.harness import run_cli

pytestmark = pytest.mark.db

ROOT = Path(__file__).resolve().parents[2]


def test_every_migration_lists_every_file_in_order_with_its_rollback() -> None:
    listed = list(migrations.every_migration())
    assert [m.id for m in listed] == migration_names()
    assert migrations.migration_ids() == [m.id for m in listed]
    for m in listed:
        assert m.sql == (migrations.migrations_dir() / f"{m.id}.sql").read_text()
        assert m.rollback_sql == (migrations.migrations_dir() / f"{m.id}.rollback.sql").read_text()
    # Every shipped migration says what it leaves in the catalog: the check cannot miss one.
    assert set(MARKS) == set(migrations.migration_ids())


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables")}


def test_each_migration_applied_by_hand_is_seen_and_each_missing_one_is_named(
    empty_dsn: str,
) -> None:
    """As an Alembic or Django migration applies them: the SQL alone, no bookkeeping."""
    ids = migrations.migration_ids()
    with pytest.raises(SchemaMissing):
        check_schema(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for n, migration in enumerate(migrations.every_migration()):
            conn.execute(migration.sql)
            if n + 1 < len(ids):
                with pytest.raises(SchemaMismatch) as caught:
                    check_schema(empty_dsn)
                assert f"{', '.join(ids[n + 1 :])} " in str(caught.value)
                assert "`brooq migrate up`" in str(caught.value)
    check_schema(empty_dsn)  # all applied: accepted
    assert not any(t.startswith(("_yoyo", "yoyo")) for t in _tables(empty_dsn))


def test_brooq_migrate_status_only_reads(empty_dsn: str) -> None:
    before = _tables(empty_dsn)
    statuses = migrations.status(empty_dsn)
    assert [s.id for s in statuses] == migrations.migration_ids()
    assert not any(s.applied for s in statuses)
    assert _tables(empty_dsn) == before  # no yoyo lock, log or version table created


def test_a_database_ahead_of_this_brooq_is_refused(dsn: str, pg: psycopg.Connection[Any]) -> None:
    pg.execute(
        "INSERT INTO _yoyo_migration (migration_hash, migration_id, applied_at_utc) "
        "VALUES ('f' || repeat('0', 63), '0099.from-a-newer-brooq', now())"
    )
    with pytest.raises(SchemaMismatch, match=r"ahead of this brooq.*0099\.from-a-newer-brooq"):
        check_schema(dsn)
    assert migrations.status(dsn)[-1] == migrations.MigrationStatus("0099.from-a-newer-brooq", True)


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["workers"],
        ["jobs", "list"],
        ["jobs", "cancel", "--topic", "email.send"],
        ["enqueue", "--topic", "email.send", "--payload", "{}"],
        ["job", "01900000-0000-7000-8000-000000000000"],
        ["cancel", "01900000-0000-7000-8000-000000000000"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_every_command_on_the_job_table_refuses_a_database_behind(
    argv: list[str],
    dsn: str,
    pg: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    migrations.down(dsn, steps=1)
    pg.execute("INSERT INTO job (topic) VALUES ('email.send')")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "behind this brooq" in err and migrations.migration_ids()[-1] in err, err
    assert "`brooq migrate up`" in err
    # Nothing was done: the job is still there and still pending.
    assert pg.execute("SELECT state FROM job").fetchall() == [("pending",)]


def test_work_and_supervise_refuse_a_database_behind_before_they_claim(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The issue's case: supervise said SupervisorReady and claimed jobs it could not settle."""
    migrations.down(dsn, steps=1)
    pg.execute("INSERT INTO job (topic) VALUES ('work')")
    for argv in (
        ["work", "--app", "tests.system.apps.sysapp:queue", "--exit-when-idle"],
        ["supervise", "--app", "tests.system.apps.sysapp:queue", "--workers", "1"],
    ):
        done = run_cli(dsn, tmp_path, *argv, timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "`brooq migrate up`" in done.stderr
        assert "SupervisorReady" not in done.stdout + done.stderr
    assert pg.execute("SELECT state, attempts FROM job").fetchall() == [("pending", 0)]


def test_migrate_itself_still_runs_on_a_database_behind(dsn: str, tmp_path: Path) -> None:
    migrations.down(dsn, steps=2)
    done = run_cli(dsn, tmp_path, "migrate", "status")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split() == ["pending", migrations.migration_ids()[-1]]
    assert run_cli(dsn, tmp_path, "migrate", "up").returncode == 0
    assert run_cli(dsn, tmp_path, "status").returncode == 0


def test_the_check_costs_no_import_of_yoyo() -> None:
    code = "import sys, brooq.cli, brooq.postgres.preflight; print('yoyo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


def test_the_library_on_a_database_behind_raises_the_clear_error(empty_dsn: str) -> None:
    # Issue 32, item 11: the library raised a raw psycopg.errors.UndefinedColumn where the
    # CLI names `brooq migrate up`.
    ids = migrations.migration_ids()
    older = ids.index("0010.job-result")  # migrated up to 0009 only
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for migration in list(migrations.every_migration())[:older]:
            conn.execute(migration.sql)
        (old_id,) = conn.execute(
            "INSERT INTO job (topic, payload) VALUES ('email.send', '{}') RETURNING id::text"
        ).fetchone() or (None,)
    queue = brooq.Queue(empty_dsn)
    queue.register("email.send", lambda claim: None)
    calls: dict[str, Callable[[], object]] = {
        "enqueue": lambda: queue.enqueue(brooq.Job("email.send", {})),
        "get": lambda: queue.get(str(old_id)),
        "claim": lambda: queue.drain(topics=["email.send"]),
    }
    try:
        for name, call in calls.items():
            with pytest.raises(SchemaBehind) as caught:
                call()
            text = str(caught.value)
            assert "behind" in text and "`brooq migrate up`" in text, (name, text)
            assert ", ".join(ids[older:]) in text, (name, text)  # the migrations it lacks
            assert isinstance(caught.value, SchemaMismatch) and isinstance(
                caught.value, brooq.BrooqError
            )
    finally:
        queue.close()
    # Given a connection (no DSN to read the catalog with), the error is as clear; so is an
    # enqueue in the caller's own transaction, and one from an asyncio app.
    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        pytest.raises(SchemaBehind, match=r"behind.*`brooq migrate up`"),
    ):
        brooq.Queue(conn).get(str(old_id))
    with psycopg.connect(empty_dsn) as conn:
        with pytest.raises(SchemaBehind, match=r"behind.*`brooq migrate up`"):
            brooq.Queue(empty_dsn).enqueue(brooq.Job("email.send", {}), conn=conn)
        conn.rollback()

    async def enqueue_async() -> None:
        async with await psycopg.AsyncConnection.connect(empty_dsn) as aconn:
            await brooq.enqueue_async(aconn, brooq.Job("email.send", {}))

    with pytest.raises(SchemaBehind, match=r"behind.*`brooq migrate up`"):
        asyncio.run(enqueue_async())
