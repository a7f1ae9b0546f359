"""Hostile input and hostile handlers (issue 12), through a real supervisor.

Nothing wedges the supervisor, nothing runs a job forever, nothing leaks:
payloads Python cannot decode, handlers that close the worker's file
descriptors, error texts that carry the DSN password, lone surrogates, 10 MB
or terminal escapes, and handlers that leave forked processes behind. Every
wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from tests.system.harness import (
    PYTHONPATH,
    Supervisor,
    alive,
    count,
    insert_jobs,
    run_cli,
    title,
    wait_until,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "hostile:queue"
TOKEN = "hostile-test-token-0123456789abcdef"
SECRET = "Wr-Zq9-s3cret-pw"


def get(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    """GET ``url``: (status, JSON body), errors included."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def http(sup: Supervisor) -> str:
    """The base URL of ``sup``'s surface."""
    return f"http://{sup.wait_event('SupervisorStarted', 15)['http']}"


def healthy(sup: Supervisor) -> bool:
    """True when /healthz answers 200."""
    return get(f"{http(sup)}/healthz")[0] == 200


def row(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    """state, attempts, last_error and last_traceback of one job."""
    cur = pg.execute(
        "SELECT state, attempts, last_error, last_traceback FROM job WHERE id = %s", (job_id,)
    )
    found = cur.fetchone()
    assert found is not None
    return dict(zip(["state", "attempts", "last_error", "last_traceback"], found, strict=True))


def settled(pg: psycopg.Connection[Any], ids: list[str]) -> bool:
    """True when none of ``ids`` is pending, processing or failed."""
    return (
        count(pg, "id = ANY(%s::uuid[]) AND state IN ('pending', 'processing', 'failed')", [ids])
        == 0
    )


# --- item 2: payloads Python cannot decode ----------------------------------------------------


@pytest.mark.timeout(120)
def test_payloads_python_cannot_decode_go_dead_at_once_without_restarts(
    pg: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    # The SQL path of docs/operations.md, exactly as the issue quotes it, and a
    # 5,001-digit integer: jsonb takes both; Python's json refuses both.
    (nested,) = [
        str(r[0])
        for r in pg.execute(
            "INSERT INTO job (topic, payload) VALUES "
            "('noop', (repeat('[',5000) || repeat(']',5000))::jsonb) RETURNING id"
        )
    ]
    (digits,) = [
        str(r[0])
        for r in pg.execute(
            "INSERT INTO job (topic, payload) VALUES "
            "('noop', ('1' || repeat('0', 5000))::jsonb) RETURNING id"
        )
    ]
    (fine,) = insert_jobs(pg, "noop", [{"ok": True}])
    sup = supervise(
        "--workers",
        "2",
        "--poll-interval",
        "200ms",
        "--lease",
        "5s",
        app=APP,
        env={"BROOQ_TOKEN": TOKEN},
    )
    sup.wait_children(2)
    wait_until(lambda: settled(pg, [nested, digits, fine]), 30, "the three jobs to settle")
    for job_id in (nested, digits):
        got = row(pg, job_id)
        assert got["state"] == "dead" and got["attempts"] == 1, got
        assert "payload cannot be decoded" in got["last_error"], got
    assert row(pg, fine)["state"] == "done"
    assert sup.events("WorkerExited") == [], "a worker died over a payload"
    assert len(sup.events("WorkerStarted")) == 2
    assert healthy(sup)

    # Every reader of the row shows it, none crashes: the CLI, its JSON, the API, status.
    for job_id in (nested, digits):
        shown = run_cli(dsn, tmp_path, "job", job_id)
        assert shown.returncode == 0, shown.stderr
        assert "cannot be decoded" in shown.stdout and "Traceback" not in shown.stderr
        assert len(shown.stdout) < 5000, "the undecodable payload is shown whole"
        as_json = run_cli(dsn, tmp_path, "job", job_id, "--json")
        assert as_json.returncode == 0, as_json.stderr
        record = json.loads(as_json.stdout)
        assert record["state"] == "dead" and record["payload"] is None
        assert "cannot be decoded" in record["payload_error"]
        status, body = get(f"{http(sup)}/jobs/{job_id}", TOKEN)
        assert status == 200 and body["state"] == "dead", body
        assert "cannot be decoded" in body["payload_error"]
    status_cli = run_cli(dsn, tmp_path, "status")
    assert status_cli.returncode == 0 and "dead in the last hour: 2" in status_cli.stdout
    assert json.loads(run_cli(dsn, tmp_path, "job", fine, "--json").stdout)["payload"] == {
        "ok": True
    }


# --- item 3: handlers that close the worker's file descriptors --------------------------------


@pytest.mark.timeout(120)
def test_handlers_closing_file_descriptors_end_dead_and_wedge_nothing(
    pg: psycopg.Connection[Any],
    supervise: Callable[..., Supervisor],
) -> None:
    sup = supervise(
        "--workers",
        "1",
        "--poll-interval",
        "100ms",
        "--lease",
        "4s",
        app=APP,
        env={"BROOQ_TOKEN": TOKEN},
    )
    (first,) = sup.wait_children(1)
    # A first effect opens the worker's own connection (the lowest free descriptor,
    # 3): close(0..10) then closes it, and stdout/stderr, under the worker.
    (warm,) = insert_jobs(pg, "fd.effect", [{}])
    wait_until(lambda: settled(pg, [warm]), 20, "the first effect")
    low = insert_jobs(pg, "fd.close-low", [{}])
    wait_until(lambda: settled(pg, low), 20, "close(0..10)")
    # The handler returned and its outcome reached the supervisor: done. The worker
    # saw its descriptors gone and left for a fresh one (no wedged connection, no
    # log line written into a socket that took stderr's number).
    got = row(pg, low[0])
    assert got["state"] == "done" and got["attempts"] == 1, got
    sup.wait_event("WorkerExited", 10, pid=first, reason="broken")
    (second,) = sup.wait_children(1, exclude=[first])
    after_low = insert_jobs(pg, "fd.effect", [{}, {}])
    wait_until(lambda: settled(pg, after_low), 20, "the effects after close(0..10)")

    # closerange(3, 1024) closes the socket to the supervisor too: the outcome
    # cannot be reported, the worker exits, each attempt is a recorded failure and
    # the last one is dead (max_attempts=2). Never processing for good.
    wide = insert_jobs(pg, "fd.closerange", [{}])
    after_wide = insert_jobs(pg, "fd.effect", [{}, {}])
    wait_until(lambda: settled(pg, wide + after_wide), 40, "closerange(3, 1024) and the effects")
    got = row(pg, wide[0])
    assert got["state"] == "dead" and got["attempts"] == 2, got
    assert "lost its connection to the supervisor" in got["last_error"], got
    for job_id in [warm, *after_low, *after_wide]:
        assert row(pg, job_id)["state"] == "done", row(pg, job_id)
    assert count(pg, "state = 'processing'") == 0
    exits = sup.events("WorkerExited")
    assert [e["reason"] for e in exits].count("crash") == 2, exits

    # The same, then the handler hangs: it can never report. The supervisor sees
    # the socket closed and kills the worker within a second; a recorded failure.
    (hang,) = insert_jobs(pg, "fd.closerange-hang", [{}])
    wait_until(lambda: settled(pg, [hang]), 15, "the hanging handler's job to settle")
    # Settled by the supervisor, not by its 4 s lease running out (no expiration).
    assert count(pg, "id = %s AND expirations = 0", [hang]) == 1
    got = row(pg, hang)
    assert got["state"] == "dead" and got["attempts"] == 1, got
    assert "broke its connection to the supervisor" in got["last_error"], got
    assert sup.events("WorkerKilled", reason="broken", job_id=hang)
    assert count(pg, "state = 'processing'") == 0
    assert sup.events("WorkerCrashLoop") == [] and sup.events("WorkerBootFailed") == []
    sup.wait_children(1, exclude=[first, second])
    wait_until(lambda: healthy(sup), 10, "/healthz to be 200 again")
    assert not sup.exited()


# --- items 4 and 6: error texts that carry secrets or hostile characters ----------------------


@pytest.fixture
def secret_dsn(dsn: str, admin_url: str, pg: psycopg.Connection[Any]) -> Iterator[str]:
    """``dsn`` as a role whose password is unmistakable (the test role's is its name).

    The superuser only creates and drops the role, from the ``postgres`` database:
    a superuser session in the test database would stop its owner from dropping it.
    The owner of the tables grants and revokes.
    """
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    role = f"hostile_{os.getpid()}_{time.monotonic_ns() % 1_000_000}"
    grants = [
        (
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
            "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}",
        ),
        (
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}",
            "REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {}",
        ),
        ("GRANT USAGE ON SCHEMA public TO {}", "REVOKE USAGE ON SCHEMA public FROM {}"),
    ]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(role), pgsql.Literal(SECRET)
            )
        )
    for grant, _ in grants:
        pg.execute(pgsql.SQL(grant).format(pgsql.Identifier(role)))
    try:
        yield (f"postgresql://{role}:{SECRET}@{params['host']}:{params['port']}/{params['dbname']}")
    finally:
        for _, revoke in grants:
            pg.execute(pgsql.SQL(revoke).format(pgsql.Identifier(role)))
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
            )
            admin.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


@pytest.mark.timeout(120)
def test_hostile_error_texts_are_recorded_bounded_escaped_and_scrubbed(
    pg: psycopg.Connection[Any],
    secret_dsn: str,
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    topics = [
        "err.surrogate",
        "err.str-interrupt",
        "err.huge",
        "err.escapes",
        "err.dsn",
        "err.password",
        "err.environment",
    ]
    ids = {topic: insert_jobs(pg, topic, [{}])[0] for topic in topics}
    sup = supervise(
        "--workers",
        "2",
        "--poll-interval",
        "100ms",
        app=APP,
        env={"DATABASE_URL": secret_dsn, "BROOQ_TOKEN": TOKEN},
    )
    sup.wait_children(2)
    wait_until(lambda: settled(pg, list(ids.values())), 60, "every err.* job to settle")
    rows = {topic: row(pg, job_id) for topic, job_id in ids.items()}
    for topic, got in rows.items():
        assert got["state"] == "dead" and got["attempts"] == 1, (topic, got)
        assert "WorkerCrashed" not in got["last_error"], (topic, got)
    assert sup.events("WorkerExited") == [], "a hostile error text killed a worker"

    # A lone surrogate is kept, escaped; an unreadable str() names the type.
    assert rows["err.surrogate"]["last_error"] == "ValueError: bad \\udcff"
    assert rows["err.str-interrupt"]["last_error"] == "StrRaises: <exception str() failed>"
    # 10 MB of message: bounded in the row, and in every log line.
    assert len(rows["err.huge"]["last_error"]) <= 2000
    assert len(rows["err.huge"]["last_traceback"]) <= 16_000
    log = sup.log_path.read_bytes()
    assert max(len(line) for line in log.splitlines()) <= 20_000
    # One line per event: no raw line or paragraph separator, NEL or CR in the log.
    for raw in ("\u2028", "\u0085", "\r"):
        assert raw.encode() not in log, f"{raw!r} reached the log raw"
    for line in log.splitlines():
        if line.startswith(b"{"):
            json.loads(line)
    # The password: not in the row, the traceback, the log, the API, the CLI.
    for topic in ("err.dsn", "err.password"):
        got = rows[topic]
        assert SECRET not in got["last_error"] and SECRET not in (got["last_traceback"] or "")
        assert "***" in got["last_error"], got
        status, body = get(f"{http(sup)}/jobs/{ids[topic]}", TOKEN)
        assert status == 200 and SECRET not in json.dumps(body)
        shown = run_cli(secret_dsn, tmp_path, "job", ids[topic])
        assert shown.returncode == 0 and SECRET not in shown.stdout + shown.stderr
    assert SECRET.encode() not in log, "the password reached the log"
    # Issue 22, item 5: what the log hides (the token too) is hidden in the row.
    got = rows["err.environment"]
    for secret in (SECRET, TOKEN):
        assert secret not in got["last_error"] + (got["last_traceback"] or ""), got
    assert "'BROOQ_TOKEN': '***'" in got["last_error"], got
    assert TOKEN.encode() not in log, "the token reached the log"
    # Terminal escapes and newlines are escaped in the CLI's text: no forged line.
    shown = run_cli(secret_dsn, tmp_path, "job", ids["err.escapes"])
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\r" not in shown.stdout
    assert [ln for ln in shown.stdout.splitlines() if ln.startswith("state")] == [
        "state            dead"
    ], shown.stdout
    status_cli = run_cli(secret_dsn, tmp_path, "status")
    assert status_cli.returncode == 0 and "\x1b" not in status_cli.stdout
    assert healthy(sup)


@pytest.mark.timeout(60)
def test_a_short_password_is_hidden_only_where_it_is_a_password(
    pg: psycopg.Connection[Any],
    dsn: str,
    supervise: Callable[..., Supervisor],
) -> None:
    # Issue 22, item 19: the test cluster's password is "brooq", a word of every path and
    # name of brooq itself; it became *** everywhere in stored errors.
    assert psycopg.conninfo.conninfo_to_dict(dsn).get("password") == "brooq"
    (job_id,) = insert_jobs(pg, "err.words", [{}])
    supervise("--workers", "1", "--poll-interval", "100ms", app=APP)
    wait_until(lambda: settled(pg, [job_id]), 30, "the err.words job to settle")
    got = row(pg, job_id)
    assert got["last_error"] == (
        "RuntimeError: brooq.Delay(5) is no error of /srv/brooq/engine/executor.py"
    ), got
    assert "/brooq/engine/executor.py" in got["last_traceback"], got["last_traceback"]
    assert "***" not in got["last_traceback"], got["last_traceback"]


@pytest.mark.timeout(60)
def test_a_malformed_database_url_is_never_shown(
    dsn: str,
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    bad = f"postgresql://brooq:Wr%ZZsecret@{params['host']}:{params['port']}/{params['dbname']}"
    for argv in (
        ["status"],
        ["migrate", "status"],
        ["job", "01900000-0000-7000-8000-000000000000"],
    ):
        done = run_cli(bad, tmp_path, *argv)
        assert done.returncode in (1, 2), (argv, done.returncode, done.stderr)
        assert "malformed (value hidden)" in done.stderr, (argv, done.stderr)
        assert "ZZsecret" not in done.stdout + done.stderr, argv
        assert "Traceback" not in done.stderr
    sup = supervise("--workers", "1", app=APP, env={"DATABASE_URL": bad})
    wait_until(
        lambda: sup.exited() or sup.events("SupervisorStarted"),
        20,
        "the supervisor to start or refuse",
    )
    if not sup.exited():
        # The surface answers "starting" until the loop's first verdict.
        status, body = wait_until(
            lambda: (answer := get(f"{http(sup)}/healthz"))[1]["reason"] != "starting" and answer,
            10,
            "the loop's first verdict",
        )
        assert status == 503 and "ZZsecret" not in json.dumps(body), body
        assert body["reason"] == "database unavailable", body
        time.sleep(1.5)
    sup.stop(timeout=10)
    text = sup.log_path.read_text(errors="replace")
    assert "ZZsecret" not in text
    assert "malformed (value hidden)" in text


# --- item 8: grandchildren ------------------------------------------------------------------


def brooq_processes_in(pids: set[int]) -> list[int]:
    """Those of ``pids`` still alive with a brooq title."""
    return [pid for pid in pids if alive(pid) and title(pid).startswith("brooq")]


@pytest.mark.timeout(90)
def test_forked_grandchildren_do_not_outlive_the_supervisor(
    pg: psycopg.Connection[Any],
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    # One grandchild stays in its worker's process group, one leaves it (setsid):
    # both ignore SIGTERM and keep the title "brooq worker …".
    pidfiles = [tmp_path / f"grandchild{n}.pid" for n in range(2)]
    sup = supervise("--workers", "2", "--poll-interval", "100ms", app=APP)
    sup.wait_children(2)
    insert_jobs(
        pg,
        "fork.grandchild",
        [{"pidfile": str(pidfiles[0])}, {"pidfile": str(pidfiles[1]), "setsid": True}],
    )
    wait_until(
        lambda: all(p.exists() and p.read_text() for p in pidfiles), 20, "both handlers to fork"
    )
    grandchildren = {int(p.read_text()) for p in pidfiles}
    assert all(title(pid).startswith("brooq worker") for pid in grandchildren)
    try:
        # A plain SIGTERM and the supervisor's own exit: not the harness's kill of
        # the process group, which would hide what the supervisor leaves behind.
        sup.send(signal.SIGTERM)
        assert sup.wait_exit(20) == 0
        wait_until(lambda: not brooq_processes_in(grandchildren), 5, "the grandchildren to be gone")
    finally:
        for pid in brooq_processes_in(grandchildren):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_processes_that_escaped_two_process_groups_do_not_outlive_the_supervisor(
    pg: psycopg.Connection[Any],
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    # Issue 22, item 14: the second escapee is not the supervisor's child until the
    # first one dies, so one pass over the supervisor's children missed it.
    pidfile = tmp_path / "escaped.pid"
    sup = supervise("--workers", "1", "--poll-interval", "100ms", app=APP)
    sup.wait_children(1)
    insert_jobs(pg, "fork.escape-twice", [{"pidfile": str(pidfile)}])
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), 20, "the handler to fork")
    escaped = {int(pid) for pid in pidfile.read_text().split()}
    assert len(escaped) == 2 and all(title(pid).startswith("brooq worker") for pid in escaped)
    assert len({os.getsid(pid) for pid in escaped}) == 2  # two sessions, two groups
    try:
        sup.send(signal.SIGTERM)
        assert sup.wait_exit(20) == 0
        wait_until(lambda: not brooq_processes_in(escaped), 5, "both escapees to be gone")
    finally:
        for pid in brooq_processes_in(escaped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_a_grandchild_dies_with_the_worker_that_forked_it(
    pg: psycopg.Connection[Any],
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    sup = supervise("--workers", "1", "--poll-interval", "100ms", app=APP)
    (worker,) = sup.wait_children(1)
    insert_jobs(pg, "fork.grandchild", [{"pidfile": str(pidfile)}])
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), 20, "the handler to fork")
    grandchild = int(pidfile.read_text())
    try:
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: not alive(grandchild), 5, "the grandchild to die with its worker")
        sup.wait_children(1, exclude=[worker])
        assert not sup.exited()
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


# --- item 6: hostile text at the command line -----------------------------------------------


def cli_env(dsn: str) -> dict[str, str]:
    """The environment of a CLI run against ``dsn`` (none of the developer's settings)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("QUEUE_", "BROOQ_", "LOG_")) and k != "DATABASE_URL"
    }
    return {**env, "DATABASE_URL": dsn, "PYTHONPATH": PYTHONPATH}


@pytest.mark.timeout(120)
def test_hostile_cli_input_is_refused_with_exit_2_and_no_traceback(
    pg: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
) -> None:
    # argv carries raw bytes; Python reads 0xff back as the lone surrogate \udcff.
    cases = [
        (["enqueue", "--topic", "ok", "--payload", "[" * 5000 + "]" * 5000], "nested too deeply"),
        (["enqueue", "--topic", "ok", "--payload", "1" + "0" * 5000], "--payload cannot be read"),
        (["enqueue", "--topic", "ok", "--payload", '"\udcff"'], "lone surrogate"),
        (["enqueue", "--topic", "ok", "--payload", "1", "--key", "k\udcff"], "lone surrogate"),
        (["enqueue", "--topic", "o\udcffk", "--payload", "1"], "is invalid"),
    ]
    for argv, message in cases:
        done = run_cli(dsn, tmp_path, *argv)
        assert done.returncode == 2, (argv[:4], done.returncode, done.stderr[-500:])
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-500:]
    assert count(pg) == 0, "a refused job was written"

    # A cancel reason with a lone surrogate is refused (exit 2), the job untouched; one with
    # terminal escapes and a newline is kept, and the row still shows on one line each.
    (job_id,) = insert_jobs(pg, "ok", [1])
    done = run_cli(dsn, tmp_path, "cancel", job_id, "--reason", "bad \udcff")
    assert done.returncode == 2 and "lone surrogate" in done.stderr, done.stderr[-500:]
    assert row(pg, job_id)["state"] == "pending"
    done = run_cli(dsn, tmp_path, "cancel", job_id, "--reason", "bad \x1b[2J\nstate done")
    assert done.returncode == 0, done.stderr
    shown = run_cli(dsn, tmp_path, "job", job_id)
    assert "\x1b" not in shown.stdout
    assert [ln for ln in shown.stdout.splitlines() if ln.startswith("state")] == [
        "state            canceled"
    ], shown.stdout
    assert "bad \x1b[2J\nstate done" in row(pg, job_id)["last_error"]


@pytest.mark.timeout(120)
def test_status_piped_into_head_ends_quietly(
    pg: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
) -> None:
    # Enough topics that status writes well past a pipe's buffer after head has left.
    pg.execute(
        "INSERT INTO job (topic, payload) SELECT 'topic.n' || g, 'null' "
        "FROM generate_series(1, 3000) g"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "brooq.cli", "status"],
        cwd=tmp_path,
        env=cli_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode(errors="replace")
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.timeout(60)
def test_config_show_hides_a_whole_escaped_password(dsn: str, tmp_path: Path) -> None:
    for url in (
        "host=127.0.0.1 password=ab\\ cd dbname=x",
        "host=127.0.0.1 password='ab\\' cd' dbname=x",
        "postgresql://u:Wr%ZZsecret@127.0.0.1/x",
    ):
        done = run_cli(url, tmp_path, "config", "show")
        assert done.returncode == 0, done.stderr
        line = next(ln for ln in done.stdout.splitlines() if "DATABASE_URL" in ln)
        assert "cd" not in line and "ab" not in line and "ZZsecret" not in line, line
        assert "***" in line, line


# --- item 2: workers that boot, then crash-loop -----------------------------------------------


@pytest.mark.timeout(60)
def test_workers_that_boot_then_crash_back_off(supervise: Callable[..., Supervisor]) -> None:
    sup = supervise("--workers", "1", app="hostile_crashloop:queue")
    wait_until(lambda: len(sup.events("WorkerCrashLoop")) >= 2, 15, "the first crash loops")
    time.sleep(5)
    loops = sup.events("WorkerCrashLoop")
    # Delays of 0.5, 1, 2, 4 s: a handful of forks in ~7 s, not the hundreds of a storm.
    assert 2 <= len(loops) <= 8, len(loops)
    delays = [float(e["retry_in_s"]) for e in loops]
    assert delays == sorted(delays) and delays[-1] > delays[0], delays
    assert all(e["exit"] == "exited with code 7" for e in loops)
    assert len(sup.events("WorkerStarted")) <= len(loops) + 1
    assert not sup.exited()
    # Between two short lives the slot is down: /healthz says so (a live one may answer 200).
    wait_until(lambda: get(f"{http(sup)}/healthz")[0] == 503, 6, "/healthz to be 503")


# --- issue 32, item 3: results that carry secrets --------------------------------------------


def login(base: str) -> str:
    """A session cookie of the dashboard at ``base`` (``name=value``), logged in with TOKEN."""
    request = urllib.request.Request(
        f"{base}/ui/login",
        data=urllib.parse.urlencode({"token": TOKEN}).encode(),
        headers={"Origin": base},
    )

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=5) as answer:
            cookie = answer.headers["Set-Cookie"]
    except urllib.error.HTTPError as error:  # the 303 after a login
        cookie = error.headers["Set-Cookie"]
    assert cookie, "the login set no cookie"
    return str(cookie).split(";")[0]


def page(url: str, cookie: str) -> str:
    """The HTML of a dashboard page read with the session ``cookie``."""
    request = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return str(answer.read().decode())


@pytest.mark.timeout(90)
def test_a_result_that_carries_secrets_is_stored_scrubbed(
    pg: psycopg.Connection[Any],
    secret_dsn: str,
    tmp_path: Path,
    supervise: Callable[..., Supervisor],
) -> None:
    # Issue 32, item 3: a handler returning its environment stored the DSN's password
    # and BROOQ_TOKEN in job.result, shown by every reader of the job.
    topics = ["result.environment", "result.environment-effect"]
    ids = {topic: insert_jobs(pg, topic, [{}])[0] for topic in topics}
    sup = supervise(
        "--workers",
        "1",
        "--poll-interval",
        "100ms",
        app=APP,
        env={"DATABASE_URL": secret_dsn, "BROOQ_TOKEN": TOKEN},
    )
    sup.wait_children(1)
    wait_until(lambda: settled(pg, list(ids.values())), 30, "the result.* jobs to settle")
    base = http(sup)
    cookie = login(base)
    for topic, job_id in ids.items():
        got = pg.execute(
            "SELECT state, result::text, result->'env'->>'BROOQ_TOKEN', result->'note'->>0 "
            "FROM job WHERE id = %s",
            (job_id,),
        ).fetchone()
        assert got is not None and got[0] == "done", (topic, got)
        stored = got[1]
        for secret in (SECRET, TOKEN):
            assert secret not in stored, (topic, secret)
        # Still JSON, scrubbed string by string: the token's value hidden, the URL kept.
        assert got[2] == "***", (topic, got[2])
        assert got[3].startswith("connected to postgresql://") and ":***@" in got[3], got[3]
        shown = run_cli(secret_dsn, tmp_path, "job", job_id)
        as_json = run_cli(secret_dsn, tmp_path, "job", job_id, "--json")
        assert shown.returncode == 0 and as_json.returncode == 0, shown.stderr + as_json.stderr
        assert json.loads(as_json.stdout)["result"]["env"]["BROOQ_TOKEN"] == "***"
        status, body = get(f"{base}/jobs/{job_id}", TOKEN)
        assert status == 200 and body["result"]["env"]["BROOQ_TOKEN"] == "***", body
        html = page(f"{base}/ui/jobs/{job_id}", cookie)
        assert "BROOQ_TOKEN" in html, "the page does not show the result"
        for text in (shown.stdout, as_json.stdout, json.dumps(body), html):
            assert SECRET not in text and TOKEN not in text, topic
    assert healthy(sup)
