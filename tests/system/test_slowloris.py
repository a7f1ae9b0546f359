"""Issue 12, item 1: slow HTTP clients (and slow scrapes) must not stall the supervisor.

A real supervisor with a 4 s lease drains jobs (some longer than the lease,
so they live on heartbeats) while 50 clients trickle ``GET /healthz
HTTP/1.1\\r\\nX: `` one byte a second for 30 s, reconnecting whenever they are
cut off. Nothing may notice: no job runs twice, /healthz answers within 1 s
every time it is asked, and SIGTERM ends the supervisor within 2 s.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
from typing import Any

import psycopg
import pytest

from tests.slow_clients import Slowloris
from tests.system.harness import count, free_port, insert_jobs, wait_until
from tests.system.obs_helpers import http_addr, scrape

pytestmark = [pytest.mark.system, pytest.mark.db]

ATTACK_S = 30.0
SIGTERM_AT_S = 27.0  # while the slow clients still trickle
LONG_JOBS_AT_S = (0.5, 9.0, 16.0)  # each batch: two jobs twice as long as the lease
LONG_JOB_S = 8.0
POLL_S = 0.5


def timed_healthz(host: str, port: int) -> tuple[float, int | str]:
    """(seconds, status or error) of one GET /healthz on a fresh connection."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=1.5)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        json.loads(resp.read())
        return time.monotonic() - started, resp.status
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return time.monotonic() - started, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


@pytest.mark.timeout(180)
def test_slow_clients_cannot_stall_the_supervisor(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    port = free_port()
    sup = supervise(
        "--workers",
        "4",
        "--lease",
        "4s",
        "--http-addr",
        f"127.0.0.1:{port}",
        "--poll-interval",
        "200ms",
        "--graceful-timeout",
        "1s",
    )
    sup.wait_children(4)
    wait_until(lambda: timed_healthz("127.0.0.1", port)[1] == 200, 15, "/healthz 200")

    attack = Slowloris("127.0.0.1", port, n=50, duration=ATTACK_S).start()
    began = attack.end - ATTACK_S  # start() returns once every client tried to connect
    polls: list[tuple[float, float, int | str]] = []
    long_jobs: list[str] = []
    expired: list[tuple[float, int]] = []
    pending_long = list(LONG_JOBS_AT_S)
    try:
        while (t := time.monotonic() - began) < SIGTERM_AT_S:
            if pending_long and t >= pending_long[0]:
                pending_long.pop(0)
                long_jobs += insert_jobs(pg, "work", [{"sleep": LONG_JOB_S}] * 2)
            insert_jobs(pg, "work", [None] * 5)
            seconds, status = timed_healthz("127.0.0.1", port)
            polls.append((round(t, 1), round(seconds, 3), status))
            # A running job whose lease ran out missed its heartbeat: any reaper may requeue it.
            if n := count(pg, "state = 'processing' AND locked_until < now()"):
                expired.append((round(t, 1), n))
            time.sleep(max(0.0, POLL_S - seconds))
        signaled = time.monotonic()
        sup.send(signal.SIGTERM)
        deadline = signaled + 30
        while not sup.exited() and time.monotonic() < deadline:
            time.sleep(0.02)
        stop_s = time.monotonic() - signaled
        code = sup.reap() if sup.exited() else None
    finally:
        attack.stop()

    problems = []
    slow = [p for p in polls if p[2] != 200 or p[1] >= 1.0]
    if slow:
        problems.append(f"/healthz slow or failing ({len(slow)} of {len(polls)}): {slow[:8]}")
    if stop_s >= 2.0 or code != 0:
        problems.append(f"SIGTERM: exit code {code} after {stop_s:.1f}s")
    if expired:
        problems.append(f"running jobs with an expired lease (heartbeats missed): {expired[:8]}")
    rerun = count(pg, "attempts > 1")
    if rerun:
        problems.append(f"{rerun} jobs ran more than once")
    unfinished = count(pg, "id = ANY(%s) AND (state <> 'done' OR attempts <> 1)", [long_jobs])
    if unfinished:
        problems.append(f"{unfinished} of {len(long_jobs)} long jobs not done exactly once")
    lost = sup.events("LeaseLost") + sup.events("JobRequeued")
    if lost:
        problems.append(f"leases lost: {lost[:4]}")
    cut = sorted(attack.stats.cut_after)
    if not cut or cut[len(cut) // 2] > 1.5:  # the server cut the trickling clients off
        problems.append(
            f"slow clients not cut off: median of {len(cut)} connections "
            f"{cut[len(cut) // 2] if cut else None}"
        )
    summary = (
        f"SIGTERM to exit {stop_s:.2f}s; {len(polls)} polls, slowest "
        f"{max(p[1] for p in polls):.3f}s; {attack.stats.connections} slow connections, "
        f"median cut after {cut[len(cut) // 2] if cut else None}"
    )
    print(summary)  # shown with -s, and in the report of a failure
    assert not problems, "\n".join([*problems, summary])
    assert len(polls) >= 40 and count(pg, "state = 'done'") >= 200


@pytest.mark.timeout(90)
def test_a_cold_scrape_of_a_table_nobody_can_read_does_not_hang(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """The database gauges run under a statement timeout, on the surface's own connection."""
    sup = supervise("--workers", "1", "--poll-interval", "200ms", "--graceful-timeout", "1s")
    addr = http_addr(sup)
    sup.wait_children(1)
    host, port = addr.rsplit(":", 1)
    wait_until(lambda: timed_healthz(host, int(port))[1] == 200, 15, "/healthz 200")
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")  # as slow as a huge table
        page = scrape(addr)
        seconds, status = timed_healthz(host, int(port))
        locker.rollback()
    assert page.seconds < 1.5, page.seconds
    assert "brooq_jobs" not in page.names() and page.value("brooq_workers") == 1
    assert status == 200 and seconds < 1.0
    insert_jobs(pg, "work", [None])
    page = wait_until(
        lambda: (p := scrape(addr)).value("brooq_jobs") >= 1 and p, 15, "the gauges back"
    )
    assert sup.stop() == 0
