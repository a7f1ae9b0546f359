"""Pause and resume a topic: the stores (in-memory and PostgreSQL alike), the claims of other
processes, the public API (sync and async), the CLI, ``brooq status``, /metrics and the
dashboard's buttons (token and CSRF like every action)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.engine.pauses import PAUSE_REFRESH_S
from brooq.engine.store import Store
from brooq.metrics import DatabaseCollector
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore
from tests.dashboard_server import TOKEN, serve_dashboard
from tests.integration.test_dashboard_http import csrf_of, login
from tests.system.harness import run_cli

pytestmark = pytest.mark.db

LEASE = timedelta(seconds=30)


@pytest.fixture(params=["fake", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    name = "fake_store" if request.param == "fake" else "pg_store"
    found: Store = request.getfixturevalue(name)
    return found


def claimed_topics(store: Store, *topics: str) -> list[str]:
    return [c.topic for c in store.claim_many("h:1:x", list(topics), LEASE, 10)]


def test_a_paused_topic_is_not_claimed_but_takes_jobs_and_cancels(store: Store) -> None:
    jobs = store.enqueue_many([brooq.Job("mail.send", i) for i in range(3)])
    store.enqueue_many([brooq.Job("sms.send")])
    pause = store.pause("mail.send", "smtp down", by="ops")
    assert (pause.topic, pause.reason, pause.paused_by) == ("mail.send", "smtp down", "ops")
    assert claimed_topics(store, "mail.send", "sms.send") == ["sms.send"]
    store.enqueue_many([brooq.Job("mail.send", 9)])  # still enqueued
    assert store.cancel(jobs[0].id)  # and canceled
    again = store.pause("mail.send", "still down", by="other")
    assert (again.paused_at, again.reason, again.paused_by) == (
        pause.paused_at,
        "still down",
        "other",
    )
    assert [p.topic for p in store.pauses()] == ["mail.send"]
    lifted = store.resume("mail.send")
    assert lifted is not None and lifted.reason == "still down"
    assert store.resume("mail.send") is None and store.pauses() == []
    assert sorted(claimed_topics(store, "mail.send")) == ["mail.send"] * 3


def test_a_topic_with_no_kind_anywhere_may_be_paused_and_bad_input_is_refused(
    store: Store,
) -> None:
    assert store.pause("not.registered.yet").topic == "not.registered.yet"
    with pytest.raises(brooq.InvalidTopic):
        store.pause("Not A Topic")
    with pytest.raises(brooq.BrooqError, match="500"):
        store.pause("mail.send", "x" * 501)
    with pytest.raises(brooq.BrooqError, match="one line"):
        store.pause("mail.send", "a\nb")
    assert [p.topic for p in store.pauses()] == ["not.registered.yet"]  # nothing half-written


def test_another_process_stops_claiming_within_the_refresh(dsn: str) -> None:
    operator, claimer = PostgresStore(dsn), PostgresStore(dsn)
    try:
        operator.enqueue_many([brooq.Job("mail.send", i) for i in range(10)])
        assert claimed_topics(claimer, "mail.send")[:1] == ["mail.send"]  # its view is fresh
        operator.enqueue_many([brooq.Job("mail.send", i) for i in range(10)])
        operator.pause("mail.send")
        time.sleep(PAUSE_REFRESH_S + 0.05)
        assert claimed_topics(claimer, "mail.send") == []
        operator.resume("mail.send")
        time.sleep(PAUSE_REFRESH_S + 0.05)
        assert len(claimed_topics(claimer, "mail.send")) == 10
    finally:
        operator.close()
        claimer.close()


def test_drain_and_the_async_api_honour_the_pause(dsn: str) -> None:
    queue = brooq.Queue(dsn)
    ran: list[int] = []
    queue.register("mail.send", lambda claim: ran.append(claim.payload))
    try:
        queue.enqueue_many([brooq.Job("mail.send", i) for i in range(3)])
        assert asyncio.run(queue.pause_async("mail.send", reason="later")).reason == "later"
        assert queue.drain().total == 0 and ran == []
        assert [p.topic for p in queue.pauses()] == ["mail.send"]
        assert asyncio.run(queue.resume_async("mail.send")) is not None
        assert queue.drain().total == 3 and sorted(ran) == [0, 1, 2]
    finally:
        queue.close()


def test_the_cli_pauses_lists_and_resumes(dsn: str, tmp_path: Path) -> None:
    paused = run_cli(dsn, tmp_path, "topics", "pause", "mail.send", "--reason", "INC-9", "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["reason"] == "INC-9"
    status = run_cli(dsn, tmp_path, "status")
    assert "paused topics" in status.stdout and "mail.send since" in status.stdout
    assert "INC-9" in status.stdout
    listed = run_cli(dsn, tmp_path, "topics", "list")
    assert listed.returncode == 0 and "paused" in listed.stdout and "INC-9" in listed.stdout
    resumed = run_cli(dsn, tmp_path, "topics", "resume", "mail.send")
    assert resumed.returncode == 0 and "resumed mail.send" in resumed.stdout
    again = run_cli(dsn, tmp_path, "topics", "resume", "mail.send")
    assert again.returncode == 0 and "was not paused" in again.stdout


def test_the_cli_refuses_a_name_that_is_not_a_topic_with_exit_2(
    dsn: str, tmp_path: Path, pg: psycopg.Connection[Any]
) -> None:
    for args in (("Mail Send",), ("mail.send", "--reason", "x" * 501), ("a..b",)):
        refused = run_cli(dsn, tmp_path, "topics", "pause", *args)
        assert refused.returncode == 2, (args, refused.stdout)
        assert refused.stderr.startswith("brooq: error: "), refused.stderr
    assert pg.execute("SELECT count(*) FROM brooq_topic_pause").fetchone() == (0,)
    assert run_cli(dsn, tmp_path, "topics", "resume", "Bad").returncode == 2


def test_metrics_say_which_topics_are_paused(dsn: str) -> None:
    store, inspection = PostgresStore(dsn), PostgresInspection(dsn)
    try:
        store.pause("mail.send")
        families = {f.name: f for f in DatabaseCollector(inspection, ["sms.send"]).collect()}
        samples = {s.labels["topic"]: s.value for s in families["brooq_topic_paused"].samples}
        assert samples == {"mail.send": 1, "sms.send": 0}
    finally:
        store.close()
        inspection.close()


def test_the_dashboard_pauses_and_resumes_with_the_token_and_csrf(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    brooq_store = PostgresStore(dsn)
    brooq_store.enqueue_many([brooq.Job("mail.send")])
    brooq_store.close()
    with serve_dashboard(dsn, TOKEN) as guarded:
        assert (
            guarded.request("POST", "/ui/topics/mail.send/pause", {"confirm": "yes"}).status == 401
        )
        cookie = {"Cookie": login(guarded)}
        page = guarded.request("GET", "/ui", headers=cookie).body
        assert 'action="/ui/topics/mail.send/pause"' in page
        csrf = csrf_of(page)
        no_csrf = guarded.request("POST", "/ui/topics/mail.send/pause", {"confirm": "yes"}, cookie)
        assert no_csrf.status == 403
        asked = guarded.request(
            "POST", "/ui/topics/mail.send/pause", {"csrf": csrf, "reason": "INC-3"}, cookie
        )
        assert asked.status == 200 and "Pause topic mail.send?" in asked.body
        assert pg.execute("SELECT count(*) FROM brooq_topic_pause").fetchone() == (0,)
        done = guarded.request(
            "POST",
            "/ui/topics/mail.send/pause",
            {"csrf": csrf, "reason": "INC-3", "confirm": "yes"},
            cookie,
        )
        assert done.status == 303
        row = pg.execute("SELECT reason, paused_by FROM brooq_topic_pause").fetchone()
        assert row == ("INC-3", "the dashboard")
        page = guarded.request("GET", "/ui", headers=cookie).body
        assert 'data-paused="yes"' in page and 'action="/ui/topics/mail.send/resume"' in page
        resumed = guarded.request(
            "POST", "/ui/topics/mail.send/resume", {"csrf": csrf, "confirm": "yes"}, cookie
        )
        assert resumed.status == 303
        assert pg.execute("SELECT count(*) FROM brooq_topic_pause").fetchone() == (0,)
    with serve_dashboard(dsn, None) as read_only:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        refused = read_only.request(
            "POST", "/ui/topics/mail.send/pause", {"confirm": "yes"}, bearer
        )
        assert refused.status == 403 and "read-only" in refused.body
        assert "/ui/topics/mail.send/pause" not in read_only.request("GET", "/ui").body
