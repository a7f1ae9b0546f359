"""Pause and resume a topic with real supervisors: no new job of a paused topic starts on any
of them within a second, jobs buffered or queued go back uncharged, running jobs finish, the
pause outlives a supervisor's restart, /metrics and /healthz say so, and a resume lets every
job run once."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.system.harness import run_cli, wait_until
from tests.system.obs_helpers import http_addr, request, scrape

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = ("--workers", "2", "--http-addr", "127.0.0.1:0", "--poll-interval", "200ms")


def notes(path: Path) -> list[tuple[str, str, str, float]]:
    """(what, job id, topic, time) of every line the handlers wrote."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        what, job_id, topic, at = line.split()
        out.append((what, job_id, topic, float(at)))
    return out


def ended(path: Path, topic: str) -> int:
    return sum(1 for what, _, t, _ in notes(path) if what == "end" and t == topic)


def rows(pg: psycopg.Connection[Any], topic: str) -> list[tuple[str, int]]:
    return [
        (r[0], r[1])
        for r in pg.execute("SELECT state, attempts FROM job WHERE topic = %s", (topic,))
    ]


@pytest.mark.timeout(120)
def test_a_paused_topic_starts_nothing_anywhere_until_resumed(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    log = tmp_path / "pause.log"
    env = {"PAUSE_LOG": str(log)}
    paused = run_cli(dsn, tmp_path, "topics", "pause", "pause.slow", "--reason", "INC-7")
    assert paused.returncode == 0, paused.stderr
    queue = brooq.Queue(dsn)
    queue.enqueue_many([brooq.Job("pause.slow", {"sleep": 0}) for _ in range(5)])
    queue.enqueue_many([brooq.Job("pause.other", {"sleep": 0}) for _ in range(5)])
    sup = supervise(*ARGS, app="sysapp_pause:queue", env=env)
    addr = http_addr(sup)
    first = scrape(addr)  # the first scrape already says it
    assert first.value("brooq_topic_paused", topic="pause.slow") == 1
    assert first.value("brooq_topic_paused", topic="pause.other") == 0
    sup.wait_event("SupervisorReady", 20)
    status, body = request(f"http://{addr}/healthz")
    assert status == 200 and json.loads(body)["paused"] == ["pause.slow"]
    wait_until(lambda: ended(log, "pause.other") == 5, 20, "the other topic's jobs run")
    time.sleep(1.0)
    assert ended(log, "pause.slow") == 0
    assert rows(pg, "pause.slow") == [("pending", 0)] * 5  # enqueued, waiting, uncharged

    # A restart of the supervisor does not lift it.
    sup.stop(timeout=30)
    sup = supervise(*ARGS, app="sysapp_pause:queue", env=env)
    sup.wait_event("SupervisorReady", 20)
    time.sleep(1.5)
    assert ended(log, "pause.slow") == 0
    listed = run_cli(dsn, tmp_path, "topics", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (slow,) = [t for t in json.loads(listed.stdout)["topics"] if t["topic"] == "pause.slow"]
    assert (slow["state"], slow["waiting"], slow["reason"]) == ("paused", 5, "INC-7")

    resumed = run_cli(dsn, tmp_path, "topics", "resume", "pause.slow")
    assert resumed.returncode == 0, resumed.stderr
    wait_until(lambda: ended(log, "pause.slow") == 5, 20, "the resumed topic's jobs run")
    addr = http_addr(sup)  # the gauge is read at most 5 s old (the scrape's cache)
    wait_until(
        lambda: scrape(addr).value("brooq_topic_paused", topic="pause.slow") == 0, 15, "gauge 0"
    )
    queue.close()


@pytest.mark.timeout(120)
def test_a_pause_stops_new_starts_within_a_second_and_gives_back_what_waits(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    log = tmp_path / "pause.log"
    sup = supervise(*ARGS, app="sysapp_pause:queue", env={"PAUSE_LOG": str(log)})
    sup.wait_event("SupervisorReady", 20)
    queue = brooq.Queue(dsn)
    jobs = queue.enqueue_many([brooq.Job("pause.slow", {"sleep": 0.3}) for _ in range(60)])
    wait_until(lambda: ended(log, "pause.slow") >= 4, 20, "some jobs ran")
    queue.pause("pause.slow", reason="the test")
    paused_at = time.time()
    sup.wait_event("TopicPaused", 5, topic="pause.slow")
    time.sleep(3.0)
    starts = [at for what, _, t, at in notes(log) if what == "start" and t == "pause.slow"]
    assert starts and max(starts) < paused_at + 1.0  # nothing new past a second
    started = {job_id for what, job_id, _, _ in notes(log) if what == "start"}
    assert {j for what, j, _, _ in notes(log) if what == "end"} == started  # running ones ended
    waiting = rows(pg, "pause.slow")
    assert sum(1 for state, _ in waiting if state == "done") == len(started)
    # Everything else went back to pending, uncharged (buffered or queued in a worker).
    assert sorted(w for w in waiting if w[0] != "done") == [("pending", 0)] * (60 - len(started))

    assert queue.resume("pause.slow") is not None
    wait_until(lambda: ended(log, "pause.slow") == 60, 40, "every job after the resume")
    counts = Counter(job_id for what, job_id, _, _ in notes(log) if what == "start")
    assert set(counts) == {j.id for j in jobs} and set(counts.values()) == {1}  # each once
    queue.close()
