"""Bad input, table-driven: through the public API, the CLI, and a real supervisor.

Every case gets a clear error (the CLI exits 2 for bad input, with a message
naming the problem and never the DSN password) or a recorded outcome; none
writes or corrupts a row (the rows are compared before and after each case)
and none kills the supervisor.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.cli import main
from brooq.vocabulary import InvalidJob, InvalidKindOptions, InvalidTopic, Job, KindOptions
from tests.system.harness import Supervisor, count, insert_jobs, run_cli, wait_until

APPS = Path(__file__).resolve().parent / "apps"
PASSWORD = "s3cret-Pa55"


def snapshot(pg: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every row, as the cases must leave it."""
    return pg.execute(
        "SELECT id, topic, state, attempts, payload, idempotency_key, last_error "
        "FROM job ORDER BY id"
    ).fetchall()


@pytest.fixture
def seeded(pg: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """A few rows that no bad input may touch."""
    insert_jobs(pg, "seed", [{"n": 1}, None, "text"])
    pg.execute("UPDATE job SET state = 'done', attempts = 1 WHERE payload = '\"text\"'::jsonb")
    return snapshot(pg)


# --- the public API ---------------------------------------------------------------------------

NESTED: Any = []
for _ in range(5000):
    NESTED = [NESTED]

API_CASES: list[tuple[str, Callable[[brooq.Queue], Any], type[BaseException], str]] = [
    (
        "payload an object",
        lambda q: q.enqueue(Job("ok", object())),
        InvalidJob,
        "not JSON-serializable",
    ),
    ("payload a set", lambda q: q.enqueue(Job("ok", {1, 2})), InvalidJob, "not JSON-serializable"),
    (
        "payload bytes",
        lambda q: q.enqueue(Job("ok", b"\x00\x01")),
        InvalidJob,
        "not JSON-serializable",
    ),
    (
        "payload a datetime",
        lambda q: q.enqueue(Job("ok", datetime.now(UTC))),
        InvalidJob,
        "not JSON-serializable",
    ),
    ("payload NaN", lambda q: q.enqueue(Job("ok", {"x": math.nan})), InvalidJob, "NaN"),
    (
        "payload nested 5000 deep",
        lambda q: q.enqueue(Job("ok", NESTED)),
        InvalidJob,
        "nested too deeply",
    ),
    ("payload with NUL", lambda q: q.enqueue(Job("ok", {"s": "a\x00b"})), InvalidJob, "NUL"),
    ("payload key with NUL", lambda q: q.enqueue(Job("ok", {"a\x00": 1})), InvalidJob, "NUL"),
    (
        "payload lone surrogate",
        lambda q: q.enqueue(Job("ok", "\ud800")),
        InvalidJob,
        "lone surrogate",
    ),
    (
        "payload too large",
        lambda q: q.enqueue(Job("ok", "x" * 2000)),
        InvalidJob,
        r"above the limit of 1000 \(QUEUE_MAX_PAYLOAD_BYTES\)",
    ),
    (
        "one bad job in a batch writes none",
        lambda q: q.enqueue_many([Job("ok", 1), Job("ok", object())]),
        InvalidJob,
        "not JSON-serializable",
    ),
    ("topic empty", lambda q: q.enqueue(Job("", 1)), InvalidTopic, "topic is empty"),
    ("topic uppercase", lambda q: q.enqueue(Job("Email.Send", 1)), InvalidTopic, "lowercase"),
    ("topic too long", lambda q: q.enqueue(Job("a" * 129, 1)), InvalidTopic, "longer than 128"),
    ("topic with spaces", lambda q: q.enqueue(Job("email send", 1)), InvalidTopic, "invalid"),
    (
        "topic with SQL",
        lambda q: q.enqueue(Job("x'; DROP TABLE job; --", 1)),
        InvalidTopic,
        "invalid",
    ),
    (
        "topic not a string",
        lambda q: q.enqueue(Job(42, 1)),  # type: ignore[arg-type]
        InvalidTopic,
        "must be a string",
    ),
    (
        "key too long",
        lambda q: q.enqueue(Job("ok", 1, idempotency_key="k" * 100_000)),
        InvalidJob,
        "hash long keys",
    ),
    ("key with NUL", lambda q: q.enqueue(Job("ok", 1, idempotency_key="a\x00")), InvalidJob, "NUL"),
    (
        "key not a string",
        lambda q: q.enqueue(Job("ok", 1, idempotency_key=7)),  # type: ignore[arg-type]
        InvalidJob,
        "must be a string",
    ),
    (
        "priority out of range",
        lambda q: q.enqueue(Job("ok", 1, priority=40_000)),
        InvalidJob,
        "priority",
    ),
    ("priority a bool", lambda q: q.enqueue(Job("ok", 1, priority=True)), InvalidJob, "priority"),
    (
        "available_at naive",
        lambda q: q.enqueue(Job("ok", 1, available_at=datetime(2030, 1, 1))),
        InvalidJob,
        "timezone-aware",
    ),
    (
        "not a Job",
        lambda q: q.enqueue({"topic": "ok"}),  # type: ignore[arg-type]
        TypeError,
        "brooq.Job",
    ),
    (
        "kind max_attempts 0",
        lambda q: q.register("ok", print, max_attempts=0),
        InvalidKindOptions,
        "max_attempts: must be at least 1",
    ),
    (
        "kind max_attempts negative",
        lambda q: q.register("ok", print, max_attempts=-3),
        InvalidKindOptions,
        "at least 1",
    ),
    (
        "kind attempt_timeout bare number text",
        lambda q: q.register("ok", print, attempt_timeout="30"),
        InvalidKindOptions,
        "attempt_timeout",
    ),
    (
        "kind attempt_timeout zero",
        lambda q: q.register("ok", print, attempt_timeout="0s"),
        InvalidKindOptions,
        "greater than zero",
    ),
    (
        "kind attempt_timeout negative",
        lambda q: q.register("ok", print, attempt_timeout=timedelta(seconds=-1)),
        InvalidKindOptions,
        "negative",
    ),
    (
        "kind backoff base above max",
        lambda q: q.register("ok", print, backoff_base="2m", backoff_max="1m"),
        InvalidKindOptions,
        "must not exceed",
    ),
    ("kind topic with SQL", lambda q: q.register("a;b", print), InvalidTopic, "invalid"),
    (
        "kind handler not callable",
        lambda q: q.register("ok", 42),  # type: ignore[arg-type]
        TypeError,
        "not callable",
    ),
    ("Delay negative", lambda q: brooq.Delay(-1), ValueError, "must not be negative"),
]


@pytest.mark.db
@pytest.mark.parametrize(
    ("case", "call", "error", "message"), API_CASES, ids=[c[0] for c in API_CASES]
)
def test_api_rejects_bad_input_and_writes_nothing(
    case: str,
    call: Callable[[brooq.Queue], Any],
    error: type[BaseException],
    message: str,
    dsn: str,
    pg: psycopg.Connection[Any],
    seeded: list[tuple[Any, ...]],
) -> None:
    queue = brooq.Queue(dsn, max_payload_bytes=1000)
    try:
        with pytest.raises(error, match=message):
            call(queue)
        assert snapshot(pg) == seeded, f"{case}: rows changed"
    finally:
        queue.close()


@pytest.mark.db
def test_bad_input_inside_the_callers_transaction_leaves_it_usable(
    dsn: str, pg: psycopg.Connection[Any], seeded: list[tuple[Any, ...]]
) -> None:
    """Validation happens before any SQL: the caller's open transaction is not aborted."""
    queue = brooq.Queue(dsn, max_payload_bytes=1000)
    try:
        with psycopg.connect(dsn) as conn, conn.transaction():
            good = queue.enqueue(Job("ok", {"good": True}), conn=conn)
            for bad in (Job("ok", object()), Job("ok", "x" * 5000), Job("ok", "\ud800")):
                with pytest.raises(InvalidJob):
                    queue.enqueue(bad, conn=conn)
            conn.execute("SELECT 1")  # still usable
        assert count(pg, "id = %s", [good.id]) == 1
        assert len(snapshot(pg)) == len(seeded) + 1
    finally:
        queue.close()


def test_kind_options_list_every_problem_at_once() -> None:
    with pytest.raises(InvalidKindOptions) as info:
        KindOptions(max_attempts=0, attempt_timeout="5", backoff_base="-1s")
    text = str(info.value)
    assert "max_attempts" in text and "attempt_timeout" in text and "backoff_base" in text


# --- the CLI ------------------------------------------------------------------------------------


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """``cli(*argv, **env)`` runs ``brooq.cli.main`` in-process; (exit code, stdout, stderr)."""
    import os

    for key in list(os.environ):
        if key.startswith(("QUEUE_", "BROOQ_", "LOG_")) or key in ("DATABASE_URL", "HTTP_ADDR"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no stray .env
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*argv: str, **env: str) -> tuple[int, str, str]:
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse
                code = int(exc.code or 0)
            finally:
                root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err

    yield run


CLI_CASES: list[tuple[str, list[str], dict[str, str], int, str]] = [
    (
        "topic uppercase",
        ["enqueue", "--payload", "null", "--topic", "Email.Send"],
        {},
        2,
        "lowercase",
    ),
    ("topic empty", ["enqueue", "--payload", "null", "--topic", ""], {}, 2, "topic is empty"),
    (
        "topic with SQL",
        ["enqueue", "--payload", "null", "--topic", "x'; DROP TABLE job; --"],
        {},
        2,
        "invalid",
    ),
    (
        "topic too long",
        ["enqueue", "--payload", "null", "--topic", "a" * 300],
        {},
        2,
        "longer than 128",
    ),
    ("topic with spaces", ["enqueue", "--payload", "null", "--topic", "a b"], {}, 2, "invalid"),
    (
        "payload not JSON",
        ["enqueue", "--topic", "ok", "--payload", "{bad"],
        {},
        2,
        "--payload is not valid JSON",
    ),
    ("payload NUL", ["enqueue", "--topic", "ok", "--payload", '"a\\u0000b"'], {}, 2, "NUL"),
    (
        "payload lone surrogate",
        ["enqueue", "--topic", "ok", "--payload", '"\\ud800"'],
        {},
        2,
        "lone surrogate",
    ),
    ("payload infinite", ["enqueue", "--topic", "ok", "--payload", "1e999"], {}, 2, "NaN"),
    (
        "payload too large",
        ["enqueue", "--topic", "ok", "--payload", json.dumps("x" * 200)],
        {"QUEUE_MAX_PAYLOAD_BYTES": "100B"},
        2,
        "QUEUE_MAX_PAYLOAD_BYTES",
    ),
    (
        "key too long",
        ["enqueue", "--payload", "null", "--topic", "ok", "--key", "k" * 5000],
        {},
        2,
        "hash long keys",
    ),
    (
        "at a bare number",
        ["enqueue", "--payload", "null", "--topic", "ok", "--at", "5"],
        {},
        2,
        "--at",
    ),
    (
        "at without zone",
        ["enqueue", "--payload", "null", "--topic", "ok", "--at", "2030-01-01T00:00:00"],
        {},
        2,
        "no time zone",
    ),
    ("lease bare number", ["config", "show"], {"QUEUE_LEASE": "5"}, 2, "QUEUE_LEASE"),
    ("lease negative", ["config", "show"], {"QUEUE_LEASE": "-5s"}, 2, "QUEUE_LEASE"),
    ("lease zero", ["config", "show"], {"QUEUE_LEASE": "0s"}, 2, "QUEUE_LEASE"),
    (
        "poll interval junk",
        ["config", "show"],
        {"QUEUE_POLL_INTERVAL": "soon"},
        2,
        "QUEUE_POLL_INTERVAL",
    ),
    ("workers zero", ["config", "show"], {"QUEUE_WORKERS": "0"}, 2, "QUEUE_WORKERS"),
    ("workers negative", ["config", "show"], {"QUEUE_WORKERS": "-2"}, 2, "QUEUE_WORKERS"),
    ("max attempts zero", ["config", "show"], {"QUEUE_MAX_ATTEMPTS": "0"}, 2, "QUEUE_MAX_ATTEMPTS"),
    (
        "retention batch zero",
        ["config", "show"],
        {"QUEUE_RETENTION_BATCH": "0"},
        2,
        "QUEUE_RETENTION_BATCH",
    ),
    (
        "payload limit zero",
        ["config", "show"],
        {"QUEUE_MAX_PAYLOAD_BYTES": "0"},
        2,
        "QUEUE_MAX_PAYLOAD_BYTES",
    ),
    (
        "lease flag bare number",
        ["supervise", "--app", "nothing:here", "--lease", "5"],
        {},
        2,
        "QUEUE_LEASE",
    ),
    ("watch zero", ["status", "--watch", "0"], {}, 2, "--watch"),
    ("unknown migrate action", ["migrate", "sideways"], {}, 2, "invalid choice"),
    # A malformed id is bad input (2); a well-formed one that matches no row is "not found" (1).
    ("malformed job id", ["job", "not-a-uuid"], {}, 2, "not a job id"),
    ("cancel malformed id", ["cancel", "123"], {}, 2, "not a job id"),
    ("job blank id", ["job", " "], {}, 2, "not a job id"),
    (
        "cancel unknown id",
        ["cancel", "01900000-0000-7000-8000-000000000000"],
        {},
        1,
        "no job with id",
    ),
]


@pytest.mark.db
@pytest.mark.parametrize(
    ("case", "argv", "env", "code", "message"), CLI_CASES, ids=[c[0] for c in CLI_CASES]
)
def test_cli_rejects_bad_input_clearly(
    case: str,
    argv: list[str],
    env: dict[str, str],
    code: int,
    message: str,
    dsn: str,
    pg: psycopg.Connection[Any],
    seeded: list[tuple[Any, ...]],
    cli: Callable[..., tuple[int, str, str]],
) -> None:
    got, out, err = cli(*argv, DATABASE_URL=dsn, **env)
    assert got == code, f"{case}: exit {got}\nstdout: {out}\nstderr: {err}"
    assert re.search(message, err), f"{case}: stderr does not name the problem:\n{err}"
    assert "Traceback" not in err
    # (the test cluster's password is "brooq": test_cli_never_prints_the_dsn_password
    # checks redaction with a password that can be told apart)
    assert snapshot(pg) == seeded, f"{case}: rows changed"


def test_cli_lists_every_config_problem_at_once(cli: Callable[..., tuple[int, str, str]]) -> None:
    code, _, err = cli(
        "config", "show", QUEUE_LEASE="5", QUEUE_WORKERS="0", QUEUE_POLL_INTERVAL="-1s"
    )
    assert code == 2
    for key in ("QUEUE_LEASE", "QUEUE_WORKERS", "QUEUE_POLL_INTERVAL"):
        assert key in err, err


def test_cli_warns_on_unknown_queue_keys_without_failing(
    cli: Callable[..., tuple[int, str, str]],
) -> None:
    code, out, err = cli("config", "show", QUEUE_LEASE_TIME="5m", QUEUE_WROKERS="3")
    assert code == 0, err
    assert "warning" in err and "QUEUE_LEASE_TIME" in err and "QUEUE_WROKERS" in err
    assert "QUEUE_WORKERS" in err  # the hint: did you mean …?
    assert "QUEUE_LEASE=" in out


@pytest.mark.parametrize(
    "dsn_with_password",
    [
        f"postgresql://brooq:{PASSWORD}@127.0.0.1:1/brooq",
        f"host=127.0.0.1 port=1 user=brooq password={PASSWORD} dbname=brooq",
        f"postgresql://brooq:{PASSWORD}@127.0.0.1:notaport/brooq",
        f"postgresql://brooq:{PASSWORD}@[::1/brooq",
    ],
)
def test_cli_never_prints_the_dsn_password(
    dsn_with_password: str, cli: Callable[..., tuple[int, str, str]]
) -> None:
    for argv in (["status"], ["enqueue", "--topic", "ok", "--payload", "1"], ["config", "show"]):
        code, out, err = cli(*argv, DATABASE_URL=dsn_with_password)
        assert PASSWORD not in out + err, f"{argv}: the password leaked"
        if argv[0] != "config":
            assert code in (1, 2) and "brooq: " in err, f"{argv}: {code} {err}"


# --- handlers that misbehave, through a real supervisor -----------------------------------------

HANDLER_OUTCOMES = {
    "bad.system-exit": ("dead", "SystemExit: 3"),
    "bad.sys-exit-zero": ("dead", "SystemExit"),
    "bad.keyboard-interrupt": ("dead", "KeyboardInterrupt"),
    "bad.base-exception": ("dead", "BaseException: a bare BaseException"),
    "bad.generator-exit": ("dead", "GeneratorExit"),
    "bad.returns": ("done", None),
    "bad.async-returns": ("done", None),
    "bad.os-exit": ("dead", "exited with code 0"),
    "bad.broken-str": ("dead", "BrokenStr: <exception str() failed>"),
    "bad.huge-error": ("dead", "RuntimeError: xxx"),
    "bad.nul-error": ("dead", "before\\0after"),
    "bad.chain-unserializable": ("dead", "not JSON-serializable"),
    "bad.hook-raises": ("dead", "ZeroDivisionError"),
    "bad.hook-sql-error": ("dead", "no_such_table"),
    "bad.negative-delay": ("dead", "Delay must not be negative"),
}


@pytest.mark.system
@pytest.mark.db
@pytest.mark.timeout(120)
def test_misbehaving_handlers_get_recorded_outcomes_and_the_supervisor_lives(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    ids = {topic: insert_jobs(pg, topic, [{"case": topic}])[0] for topic in HANDLER_OUTCOMES}
    (orphan,) = insert_jobs(pg, "nobody.serves", [{"waits": True}])
    sup = Supervisor(
        dsn,
        tmp_path,
        app="badhandlers:queue",
        args=(
            "--workers",
            "2",
            "--poll-interval",
            "200ms",
            "--lease",
            "5s",
            "--http-addr",
            "127.0.0.1:0",
        ),
        env={"PYTHONPATH": str(APPS)},
    )
    sup.start()
    try:
        sup.wait_children(2)
        wait_until(
            lambda: (
                count(pg, "topic LIKE 'bad.%%' AND state IN ('pending', 'processing', 'failed')")
                == 0
            ),
            60,
            "every bad.* job to finish",
        )
        rows = {
            r[0]: r[1:]
            for r in pg.execute(
                "SELECT topic, state, attempts, last_error FROM job WHERE topic LIKE 'bad.%%'"
            )
        }
        for topic, (state, error) in HANDLER_OUTCOMES.items():
            got_state, attempts, last_error = rows[topic]
            assert (got_state, attempts) == (state, 1), f"{topic}: {rows[topic]}"
            if error is None:
                assert last_error is None, f"{topic}: {last_error}"
            else:
                assert last_error and error in last_error, f"{topic}: {last_error!r}"
        assert len(rows["bad.huge-error"][2]) <= 2000
        assert count(pg, "topic LIKE 'bad.%%'") == len(HANDLER_OUTCOMES), "a chain leaked a row"
        assert not sup.exited(), "the supervisor died"
        sup.wait_children(2)
        crashes = [e for e in sup.events("WorkerExited") if e["reason"] == "crash"]
        assert len(crashes) == 1, crashes  # os._exit only; the rest never leave the handler
        assert len(sup.events("WorkerStarted")) == 3  # two, and one replacement

        # A topic nobody serves: left pending, untouched, visible in `brooq status --json`.
        row = pg.execute(
            "SELECT state, attempts, locked_by FROM job WHERE id = %s", (orphan,)
        ).fetchone()
        assert row == ("pending", 0, None)
        done = run_cli(dsn, tmp_path, "status", "--json")
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert {"topic": "nobody.serves", "state": "pending", "jobs": 1} in status["depth"]
        assert status["oldest_ready_s"].get("nobody.serves", 0) > 0
        assert set(ids) == set(rows)
        assert sup.stop() == 0
    finally:
        sup.stop(timeout=10)
