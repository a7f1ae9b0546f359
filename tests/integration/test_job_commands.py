"""``brooq jobs list|retry|cancel|purge`` and ``brooq workers``: filters, paging, JSON, guards.

The guards are the point: retry never touches a live row (pending, failed,
processing) nor a done one, cancel only waiting rows, purge never deletes a
live row, whatever the filters say.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.cli import main

pytestmark = pytest.mark.db

Run = Any


@pytest.fixture
def brooq(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, dsn: str
) -> Run:
    """Run ``brooq ARGS`` in-process; (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.setenv("DATABASE_URL", dsn)

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own refusals
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def insert(
    pg: psycopg.Connection[Any],
    topic: str,
    state: str,
    n: int = 1,
    age: str = "0 seconds",
    **extra: str,
) -> list[str]:
    """``n`` rows of ``topic`` in ``state``, last updated ``age`` ago; their ids."""
    locked = (
        ("'host-a:1:x'", "now() + interval '1 minute'")
        if state == "processing"
        else ("NULL", "NULL")
    )
    rows = pg.execute(
        "INSERT INTO job (topic, payload, state, attempts, expirations, locked_by, locked_until, "
        "last_error, idempotency_key, updated_at) "
        f"SELECT %s, jsonb_build_object('n', i), %s, 3, 1, {locked[0]}, {locked[1]}, %s, %s, "
        "now() - %s::interval - i * interval '1 millisecond' FROM generate_series(1, %s) i "
        "RETURNING id::text",
        (topic, state, extra.get("error"), extra.get("key"), age, n),
    ).fetchall()
    return [r[0] for r in rows]


def states(pg: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(pg.execute("SELECT state, count(*) FROM job GROUP BY state").fetchall())


def row(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    cur = pg.cursor(row_factory=psycopg.rows.dict_row)
    found = cur.execute("SELECT * FROM job WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return found


EVERY_STATE = ("pending", "failed", "processing", "done", "dead", "canceled")


def seed_every_state(pg: psycopg.Connection[Any], topic: str = "email.send") -> dict[str, str]:
    return {state: insert(pg, topic, state)[0] for state in EVERY_STATE}


# --- list -------------------------------------------------------------------------------------


def test_list_shows_a_table_newest_first(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    old = insert(pg, "email.send", "dead", age="2 hours", error="ValueError: " + "x" * 200)[0]
    new = insert(pg, "report.build", "pending")[0]
    code, out, _ = brooq("jobs", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["id", "topic", "state", "attempts"]
    assert "available_at" in lines[0] and "updated_at" in lines[0] and "last_error" in lines[0]
    assert lines[1].startswith(new) and lines[2].startswith(old)
    assert "ValueError: xxx" in lines[2] and "…" in lines[2] and len(lines[2]) < 220


def test_list_filters_by_topic_state_and_window(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    a = insert(pg, "a.one", "dead", 2)
    b = insert(pg, "b.two", "dead", 1)
    insert(pg, "c.three", "dead", 1)
    insert(pg, "a.one", "done", 3)
    old = insert(pg, "a.one", "dead", 1, age="3 hours")
    _, out, _ = brooq(
        "jobs",
        "list",
        "--json",
        "--topic",
        "a.one",
        "--topic",
        "b.two",
        "--state",
        "dead",
        "--since",
        "1h",
    )
    listed = json.loads(out)
    assert {j["id"] for j in listed["jobs"]} == set(a + b)
    assert listed["count"] == 3 and listed["next"] is None
    _, out, _ = brooq("jobs", "list", "--json", "--state", "dead", "--until", "1h")
    assert [j["id"] for j in json.loads(out)["jobs"]] == old
    _, out, _ = brooq(
        "jobs",
        "list",
        "--json",
        "--since",
        "2000-01-01T00:00:00Z",
        "--until",
        "2999-01-01T00:00:00+00:00",
        "--state",
        "done",
    )
    assert len(json.loads(out)["jobs"]) == 3


def test_list_pages_with_a_cursor_until_the_end(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    ids = insert(pg, "email.send", "done", 7)
    seen: list[str] = []
    after: list[str] = []
    for _ in range(5):
        code, out, _ = brooq("jobs", "list", "--json", "--limit", "3", *after)
        assert code == 0
        page = json.loads(out)
        seen += [j["id"] for j in page["jobs"]]
        if page["next"] is None:
            break
        after = ["--after", page["next"]]
    assert seen == ids  # newest first: the insert made row i older by i ms
    assert len(set(seen)) == 7
    _, _, err = brooq("jobs", "list", "--limit", "3")
    assert "next page: --after " in err


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "list", "--state", "finished"],
        ["jobs", "list", "--since", "yesterday"],
        ["jobs", "list", "--since", "2026-01-01T00:00:00"],  # no zone
        ["jobs", "list", "--since", "1h", "--until", "2h"],
        ["jobs", "list", "--limit", "-1"],
        ["jobs", "list", "--limit", "many"],
        ["jobs", "list", "--after", "garbage"],
        ["jobs", "list", "--topic", "Not A Topic"],
        ["jobs", "retry"],
        ["jobs", "retry", "--state", "pending"],
        ["jobs", "retry", "not-a-uuid"],
        ["jobs", "cancel"],
        ["jobs", "cancel", "--topic", "a", "--state", "processing"],
        ["jobs", "purge"],
        ["jobs", "purge", "--state", "pending"],
        ["jobs", "purge", "--state", "processing"],
    ],
)
def test_bad_input_exits_2_and_changes_nothing(
    brooq: Run, pg: psycopg.Connection[Any], args: list[str]
) -> None:
    seed_every_state(pg)
    before = states(pg)
    code, out, err = brooq(*args)
    assert code == 2, (args, out, err)
    assert "Traceback" not in err
    assert states(pg) == before


# --- retry ------------------------------------------------------------------------------------


def test_retry_ids_moves_dead_to_pending_as_new_keeping_the_key(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    dead = insert(pg, "email.send", "dead", key="order-42", error="boom")[0]
    code, out, _ = brooq("jobs", "retry", dead)
    assert code == 0 and out.strip() == "retried 1 job"
    after = row(pg, dead)
    assert after["state"] == "pending" and after["attempts"] == 0
    assert after["expirations"] == 0 and after["idempotency_key"] == "order-42"
    assert after["locked_by"] is None
    assert pg.execute(
        "SELECT available_at <= now() FROM job WHERE id = %s", (dead,)
    ).fetchone() == (True,)


def test_retry_never_touches_a_live_or_done_row(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    ids = seed_every_state(pg)
    before = {s: row(pg, i) for s, i in ids.items()}
    code, out, _ = brooq("jobs", "retry", "--json", *ids.values())
    assert code == 0
    assert json.loads(out) == {"retried": 1, "dry_run": False, "ids": [ids["dead"]]}
    for state in ("pending", "failed", "processing", "done", "canceled"):
        assert row(pg, ids[state]) == before[state], state
    # By filter: only dead rows, even with every other state present.
    insert(pg, "email.send", "dead", 3)
    code, out, _ = brooq("jobs", "retry", "--state", "dead", "--topic", "email.send")
    assert out.strip() == "retried 3 jobs"
    for state in ("pending", "failed", "processing", "done", "canceled"):
        assert row(pg, ids[state]) == before[state], state


def test_retry_of_a_live_id_fails_and_says_why(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    running = insert(pg, "email.send", "processing")[0]
    before = row(pg, running)
    code, out, err = brooq("jobs", "retry", running)
    assert code == 1 and "retried 0 jobs" in out and "not dead" in err
    assert row(pg, running) == before


def test_retry_canceled_needs_state_canceled(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    canceled = insert(pg, "email.send", "canceled", 2)
    dead = insert(pg, "email.send", "dead")[0]
    _, out, _ = brooq("jobs", "retry", "--state", "dead")
    assert out.strip() == "retried 1 job" and row(pg, canceled[0])["state"] == "canceled"
    assert row(pg, dead)["state"] == "pending"
    _, out, _ = brooq("jobs", "retry", "--state", "canceled", "--dry-run")
    assert out.startswith("would have retried 2 jobs")
    assert row(pg, canceled[0])["state"] == "canceled"
    _, out, _ = brooq("jobs", "retry", "--state", "canceled", "--json")
    assert json.loads(out)["retried"] == 2
    assert {row(pg, i)["state"] for i in canceled} == {"pending"}


def test_retry_limit_caps_the_rows_changed(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    insert(pg, "email.send", "dead", 5)
    _, out, _ = brooq("jobs", "retry", "--state", "dead", "--limit", "2")
    assert out.strip() == "retried 2 jobs"
    assert states(pg) == {"dead": 3, "pending": 2}


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_by_topic_cancels_waiting_rows_only(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    ids = seed_every_state(pg, "email.send")
    other = insert(pg, "report.build", "pending")[0]
    code, out, _ = brooq("jobs", "cancel", "--topic", "email.send", "--reason", "bad deploy")
    assert code == 0 and out.strip() == "canceled 2 jobs"
    assert row(pg, ids["pending"])["state"] == "canceled"
    assert row(pg, ids["failed"])["last_error"] == "canceled: bad deploy"
    assert row(pg, ids["processing"])["state"] == "processing"
    assert row(pg, ids["done"])["state"] == "done"
    assert row(pg, other)["state"] == "pending"


def test_cancel_with_state_failed_and_json(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    ids = seed_every_state(pg)
    _, out, _ = brooq("jobs", "cancel", "--topic", "email.send", "--state", "failed", "--json")
    assert json.loads(out) == {"canceled": 1, "dry_run": False, "left": 0}
    assert row(pg, ids["pending"])["state"] == "pending"
    assert row(pg, ids["failed"])["state"] == "canceled"


@pytest.mark.timeout(60)
def test_cancel_takes_every_row_it_can_and_says_how_many_were_locked(
    brooq: Run, pg: psycopg.Connection[Any], dsn: str
) -> None:
    # Issue 32, item 5: rows locked by another transaction were passed over in silence
    # ("canceled 3000 jobs", exit 0, with the rest left).
    ids = insert(pg, "email.send", "pending", 4500) + insert(pg, "email.send", "failed", 500)
    other = insert(pg, "report.build", "pending")[0]
    held = ids[1700:1740] + ids[4990:]  # in the middle of a batch, and the last rows
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT id FROM job WHERE id = ANY(%s::uuid[]) FOR UPDATE", (held,))
        code, out, err = brooq("jobs", "cancel", "--topic", "email.send")
        assert code == 1, (out, err)
        assert out.strip() == "canceled 4950 jobs"
        assert "50 matching jobs were not canceled: locked by another transaction" in err
        got = states(pg)
        assert got == {"canceled": 4950, "pending": 41, "failed": 10}, got
        assert {r[0] for r in pg.execute("SELECT id::text FROM job WHERE state <> 'canceled'")} == {
            *held,
            other,
        }
        code, out, _ = brooq("jobs", "cancel", "--topic", "email.send", "--json")
        assert code == 1 and json.loads(out) == {"canceled": 0, "dry_run": False, "left": 50}
    # The lock gone, the same command takes the rest and exits 0.
    code, out, err = brooq("jobs", "cancel", "--topic", "email.send")
    assert (code, out.strip(), err) == (0, "canceled 50 jobs", "")
    assert row(pg, other)["state"] == "pending"


@pytest.mark.timeout(60)
def test_cancel_passes_again_over_rows_a_short_lock_held(
    brooq: Run, pg: psycopg.Connection[Any], dsn: str
) -> None:
    # A short batch is not the end: rows held a moment (a claim, a short transaction) are
    # taken by a later pass, not left behind.
    ids = insert(pg, "email.send", "pending", 3000)
    held = ids[500:530]
    locker = psycopg.connect(dsn)
    locker.execute("SELECT id FROM job WHERE id = ANY(%s::uuid[]) FOR UPDATE", (held,))

    def release_once_the_rest_is_canceled() -> None:
        with psycopg.connect(dsn, autocommit=True) as watcher:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                done = watcher.execute("SELECT count(*) FROM job WHERE state = 'canceled'")
                if (done.fetchone() or [0])[0] >= 2970:
                    break
                time.sleep(0.01)
        locker.rollback()

    releaser = threading.Thread(target=release_once_the_rest_is_canceled, daemon=True)
    releaser.start()
    try:
        code, out, err = brooq("jobs", "cancel", "--topic", "email.send")
    finally:
        releaser.join(25)
        locker.close()
    assert (code, out.strip(), err) == (0, "canceled 3000 jobs", ""), err
    assert states(pg) == {"canceled": 3000}


# --- purge ------------------------------------------------------------------------------------


def test_purge_deletes_terminal_rows_in_batches_never_a_live_one(
    brooq: Run, pg: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import brooq.postgres.admin as admin

    monkeypatch.setattr(admin, "BATCH", 4)
    ids = seed_every_state(pg)
    insert(pg, "email.send", "done", 9)
    code, out, _ = brooq("jobs", "purge", "--state", "done")
    assert code == 0 and out.strip() == "purged 10 jobs"
    left = states(pg)
    assert "done" not in left
    for state in ("pending", "failed", "processing", "dead", "canceled"):
        assert row(pg, ids[state])["state"] == state


def test_purge_with_filters_dry_run_and_json(brooq: Run, pg: psycopg.Connection[Any]) -> None:
    insert(pg, "a.one", "dead", 2, age="3 hours")
    recent = insert(pg, "a.one", "dead", 1)
    insert(pg, "b.two", "dead", 1, age="3 hours")
    _, out, _ = brooq(
        "jobs",
        "purge",
        "--state",
        "dead",
        "--topic",
        "a.one",
        "--until",
        "1h",
        "--dry-run",
        "--json",
    )
    assert json.loads(out) == {"purged": 2, "dry_run": True}
    assert states(pg) == {"dead": 4}
    _, out, _ = brooq(
        "jobs", "purge", "--state", "dead", "--topic", "a.one", "--until", "1h", "--json"
    )
    assert json.loads(out) == {"purged": 2, "dry_run": False}
    assert {r[0] for r in pg.execute("SELECT topic FROM job")} == {"a.one", "b.two"}
    assert row(pg, recent[0])["state"] == "dead"


# --- workers and status -----------------------------------------------------------------------


def register(
    pg: psycopg.Connection[Any],
    holder: str,
    topics: list[str],
    seen: str,
    workers: list[dict[str, Any]],
) -> None:
    pg.execute(
        "INSERT INTO brooq_supervisor (holder, host, pid, app, topics, seen_at, workers) "
        "VALUES (%s, 'host-a', 4242, 'app:queue', %s, now() - %s::interval, %s)",
        (holder, topics, seen, json.dumps(workers)),
    )


def test_workers_lists_live_supervisors_and_what_they_run(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    job = insert(pg, "email.send", "processing")[0]
    register(
        pg,
        "host-a:4242:live",
        ["email.send"],
        "1 second",
        [
            {
                "pid": 5001,
                "slot": 0,
                "job_id": job,
                "topic": "email.send",
                "started_at": "2026-01-01T00:00:00+00:00",
            },
            {"pid": 5002, "slot": 1, "job_id": None, "topic": None, "started_at": None},
        ],
    )
    register(pg, "host-b:99:gone", ["report.build"], "10 minutes", [])
    code, out, _ = brooq("workers")
    assert code == 0
    assert "host-a:4242:live" in out and job in out and "idle" in out
    assert "host-b:99:gone" not in out
    _, out, _ = brooq("workers", "--all")
    assert "host-b:99:gone" in out and "dead?" in out
    _, out, _ = brooq("workers", "--json")
    (sup,) = json.loads(out)["supervisors"]
    assert sup["topics"] == ["email.send"] and sup["workers"][0]["job_id"] == job
    assert sup["workers"][0]["elapsed_s"] > 0 and sup["workers"][1]["job_id"] is None


def test_status_names_topics_with_ready_jobs_and_no_live_worker(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    insert(pg, "email.send", "pending")
    insert(pg, "report.build", "pending")
    running = insert(pg, "email.send", "processing")[0]
    register(
        pg,
        "host-a:1:x",
        ["email.send"],
        "1 second",
        [
            {
                "pid": 7,
                "slot": 0,
                "job_id": running,
                "topic": "email.send",
                "started_at": "2026-01-01T00:00:00+00:00",
            }
        ],
    )
    register(pg, "host-b:1:y", ["report.build"], "10 minutes", [])  # dead: does not count
    _, out, _ = brooq("status")
    assert "workers: 1 in 1 supervisor, 1 busy" in out
    assert f"worker 0 pid 7: job {running} (email.send) for " in out
    assert "NO LIVE WORKER serves these topics with ready jobs: report.build" in out
    _, out, _ = brooq("status", "--json")
    snap = json.loads(out)
    assert snap["unserved_topics"] == ["report.build"]
    assert [s["holder"] for s in snap["supervisors"]] == ["host-a:1:x"]


def test_no_worker_at_all_lists_every_topic_with_ready_jobs(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    insert(pg, "email.send", "pending")
    insert(pg, "later.one", "done")
    _, out, _ = brooq("workers")
    assert out.strip() == "no live supervisor against this database"
    _, out, _ = brooq("status", "--json")
    assert json.loads(out)["unserved_topics"] == ["email.send"]


def test_brooq_job_shows_the_result_and_jobs_list_does_not_carry_it(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    (job_id,) = insert(pg, "report", "done")
    pg.execute(
        "UPDATE job SET result = %s::jsonb WHERE id = %s",
        ('{"rows": 42, "note": "\\u001b[31mred"}', job_id),
    )
    code, out, _ = brooq("job", job_id)
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("result")]
    assert '"rows": 42' in line and "\x1b" not in line  # escaped like every field
    code, out, _ = brooq("job", job_id, "--json")
    assert code == 0 and json.loads(out)["result"] == {"rows": 42, "note": "\x1b[31mred"}
    code, out, _ = brooq("jobs", "list", "--json")
    assert code == 0
    listed = json.loads(out)
    rows = listed["jobs"] if isinstance(listed, dict) else listed
    assert rows and all("result" not in row for row in rows)


# --- a job's own options ------------------------------------------------------------------------


def test_enqueue_flags_override_the_kinds_options_and_brooq_job_shows_them(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    code, out, err = brooq(
        "enqueue",
        "--topic",
        "report",
        "--payload",
        "{}",
        "--max-attempts",
        "20",
        "--attempt-timeout",
        "10s",
        "--max-execution-timeout",
        "1m30s",
        "--backoff-base",
        "500ms",
        "--backoff-max",
        "2h",
    )
    assert code == 0, err
    job_id = json.loads(out)["id"]
    row = pg.execute(
        "SELECT max_attempts, attempt_timeout, max_execution_timeout, backoff_base, backoff_max "
        "FROM job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None and [str(v) for v in row] == [
        "20",
        "0:00:10",
        "0:01:30",
        "0:00:00.500000",
        "2:00:00",
    ]
    code, out, _ = brooq("job", job_id)
    assert code == 0
    lines = dict(ln.split(None, 1) for ln in out.splitlines() if len(ln.split(None, 1)) == 2)
    assert (lines["max_attempts"], lines["attempt_timeout"], lines["backoff_base"]) == (
        "20",
        "10s",
        "500ms",
    )
    assert (lines["max_execution_timeout"], lines["backoff_max"]) == ("1m30s", "2h")
    assert "trace_context" not in lines
    code, out, _ = brooq("job", job_id, "--json")
    shown = json.loads(out)
    assert (shown["max_attempts"], shown["max_execution_timeout"]) == (20, "1m30s")
    assert shown["trace_context"] is None

    code, out, _ = brooq("enqueue", "--topic", "report", "--payload", "{}")
    code, out, _ = brooq("job", json.loads(out)["id"])
    assert "max_attempts" not in out and "backoff_base" not in out  # the kind's options hold


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--attempt-timeout", "10"], 'attempt_timeout: "10" has no unit; write e.g. 10s'),
        (["--max-attempts", "0"], "max_attempts: must be at least 1, got 0"),
        (["--max-attempts", "two"], "--max-attempts must be a whole number, got 'two'"),
        (["--backoff-base=-1s"], "backoff_base: must not be negative"),
        (
            ["--attempt-timeout", "2m", "--max-execution-timeout", "1m"],
            "attempt_timeout (2m) must not exceed max_execution_timeout (1m)",
        ),
    ],
)
def test_a_bad_override_exits_2_with_the_kind_options_error_and_enqueues_nothing(
    brooq: Run, pg: psycopg.Connection[Any], flags: list[str], message: str
) -> None:
    code, out, err = brooq("enqueue", "--topic", "report", "--payload", "{}", *flags)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err
    assert pg.execute("SELECT count(*) FROM job").fetchone() == (0,)
