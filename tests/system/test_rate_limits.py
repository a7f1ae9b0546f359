"""Rate limits across real supervisors: three ``brooq supervise`` processes share one topic's
limit, and the start times their handlers record never break it in any 1-second window.

The handlers (apps/sysapp_rates.py) append each start to a file; the windows
are checked on those times, over every supervisor, re-runs included. Each
scenario also bounds the run's length, so a limit that held by starving the
topic would fail too. Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, count, run_cli, wait_until
from tests.system.obs_helpers import http_addr, scrape

pytestmark = [pytest.mark.system, pytest.mark.db]

RATE, BURST = 20, 5
"""api.call's limit (apps/sysapp_rates.py): 20/s, burst 5."""
KEY_RATE, KEY_BURST = 2, 2
"""tenant.call's limit per key: 2/s, burst one interval's worth."""
ARGS = ("--workers", "2", "--graceful-timeout", "3s")
SLACK = 1.15
"""The run may take 15% more than the limit's own pace."""


def start_three(supervise: Any, starts: Path, **env: str) -> list[Supervisor]:
    """Three supervisors of sysapp_rates, their workers up (their limits declared)."""
    sups = [
        supervise(
            *ARGS,
            app="sysapp_rates:queue",
            name=f"rates-{n}",
            env={"RATE_STARTS": str(starts), **env},
        )
        for n in range(3)
    ]
    for sup in sups:
        sup.wait_children(2, timeout=60)
    return sups


def enqueue(
    pg: psycopg.Connection[Any], topic: str, keys: list[str | None], payload: Any = None
) -> float:
    """One job per entry of ``keys`` (its rate_key, and the payload when none is given), in
    one transaction, then NOTIFY; the wall-clock time just before the commit."""
    with pg.transaction():
        pg.execute(
            "INSERT INTO job (topic, payload, rate_key) "
            "SELECT %s, COALESCE(%s::jsonb, to_jsonb(k), 'null'), k "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS t(k, n) ORDER BY n",
            (topic, None if payload is None else json.dumps(payload), keys),
        )
        at = time.time()
    pg.execute("SELECT pg_notify('brooq_job', %s)", (topic,))
    return at


def read_starts(path: Path) -> list[dict[str, Any]]:
    """Every start the handlers recorded so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def busiest_window(times: list[float], width: float = 1.0) -> int:
    """The most starts in any closed window of ``width`` seconds."""
    times = sorted(times)
    most, low = 0, 0
    for high, t in enumerate(times):
        while times[low] < t - width:
            low += 1
        most = max(most, high - low + 1)
    return most


def all_done(pg: psycopg.Connection[Any], topic: str, jobs: int) -> bool:
    return count(pg, "topic = %s AND state = 'done'", (topic,)) == jobs


def test_busiest_window_counts_a_closed_window() -> None:
    assert busiest_window([]) == 0
    assert busiest_window([0.0, 1.0]) == 2  # both ends of one second
    assert busiest_window([0.0, 1.0001]) == 1
    assert busiest_window([0.0, 0.5, 0.9, 1.2, 1.3, 1.4]) == 5


@pytest.mark.timeout(120)
def test_three_supervisors_share_one_limit(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """api.call at 20/s burst 5, 600 jobs, three supervisors: never more than 25 starts in a
    second, and done within 600/20 s + 15%."""
    jobs = 600
    starts = tmp_path / "starts.jsonl"
    sups = start_three(supervise, starts)
    first = scrape(http_addr(sups[0]))  # before any job: every series there already
    assert first.matching("brooq_rate_limited_total", topic="api.call")
    assert first.value("brooq_rate_limited_total", topic="api.call") == 0
    assert first.value("brooq_rate_tokens", topic="api.call") == BURST
    began = enqueue(pg, "api.call", [None] * jobs)
    wait_until(lambda: all_done(pg, "api.call", jobs), 60, f"{jobs} api.call jobs done", 0.2)

    recorded = read_starts(starts)
    times = [s["t"] for s in recorded]
    assert len({s["id"] for s in recorded}) == jobs
    busiest = busiest_window(times)
    assert busiest <= BURST + RATE, f"{busiest} starts within one second (limit {BURST + RATE})"
    took = max(times) - began
    assert took <= jobs / RATE * SLACK, f"the run took {took:.1f}s"
    assert len({s["pid"] for s in recorded}) >= 4, "the supervisors did not share the work"

    # What an operator sees: the claims the limit cut short, the tokens, the limit itself.
    limited = sum(
        scrape(http_addr(s)).value("brooq_rate_limited_total", topic="api.call") for s in sups
    )
    assert limited > 0
    page = scrape(http_addr(sups[0]))
    assert page.matching("brooq_rate_tokens", topic="api.call")
    status = run_cli(dsn, tmp_path, "status", "--json")
    assert status.returncode == 0, status.stderr
    (rate,) = [r for r in json.loads(status.stdout)["rate_limits"] if r["topic"] == "api.call"]
    assert (rate["limit"], rate["burst"]) == ("20/s", 5) and 0 <= rate["tokens"] <= 5


@pytest.mark.timeout(120)
def test_fifty_keys_each_get_their_own_limit(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """tenant.call at 2/s per key (burst 2), 50 keys × 12 jobs over three supervisors: never
    more than 4 starts of a key in a second, every key served at its own pace (the run takes
    no longer than 12/2 s + 15%), none starved by the others."""
    keys, per_key = 50, 12
    starts = tmp_path / "starts.jsonl"
    start_three(supervise, starts)
    # Key by key in enqueue order: the first keys' jobs come first in claim order.
    order: list[str | None] = [f"tenant-{k}" for k in range(keys) for _ in range(per_key)]
    began = enqueue(pg, "tenant.call", order)
    total = keys * per_key
    wait_until(lambda: all_done(pg, "tenant.call", total), 60, f"{total} jobs done", 0.2)

    by_key: dict[str, list[float]] = defaultdict(list)
    for s in read_starts(starts):
        by_key[s["key"]].append(s["t"])
    assert sorted(by_key) == sorted({k for k in order if k})
    worst = max(by_key, key=lambda k: busiest_window(by_key[k]))
    busiest = busiest_window(by_key[worst])
    assert busiest <= KEY_BURST + KEY_RATE, f"key {worst}: {busiest} starts within one second"
    took = max(t for ts in by_key.values() for t in ts) - began
    assert took <= per_key / KEY_RATE * SLACK, f"the run took {took:.1f}s"
    # The last key's first job started with the first keys' (no key waits behind another).
    last_first = min(by_key[f"tenant-{keys - 1}"]) - began
    assert last_first < 2.0, f"the last key started {last_first:.1f}s after the enqueue"


@pytest.mark.timeout(120)
def test_a_supervisor_killed_mid_run_breaks_no_window(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """SIGKILL one of the three a third of the way: the jobs it ran come back through the
    reaper and run again, each start on a token of its own; no second ever holds more than
    25 starts, re-runs included."""
    jobs = 300
    starts = tmp_path / "starts.jsonl"
    lease = {"QUEUE_LEASE": "2s", "QUEUE_REAPER_PERIOD": "1s"}
    sups = start_three(supervise, starts, **lease)
    # Handlers of 0.25 s: the victim holds running jobs when it dies.
    enqueue(pg, "api.call", [None] * jobs, {"sleep": 0.25})
    wait_until(lambda: len(read_starts(starts)) >= jobs // 3, 30, "a third of the starts", 0.05)
    victim = sups[1]
    victim.send(signal.SIGKILL)
    victim.wait_exit(10)
    wait_until(lambda: all_done(pg, "api.call", jobs), 60, f"{jobs} api.call jobs done", 0.2)

    recorded = read_starts(starts)
    assert len({s["id"] for s in recorded}) == jobs
    assert count(pg, "expirations > 0") > 0, "the victim held no job: the test proves nothing"
    busiest = busiest_window([s["t"] for s in recorded])
    assert busiest <= BURST + RATE, f"{busiest} starts within one second (limit {BURST + RATE})"
    assert count(pg, "state <> 'done'") == 0
