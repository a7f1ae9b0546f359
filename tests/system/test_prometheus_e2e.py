"""A real Prometheus (the Debian package's binary, run directly on a private port; its
system service is neither needed nor touched) scrapes a real supervisor every second and
evaluates brooq's alert rules and the Grafana dashboard's queries."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.metrics import OUTCOMES
from brooq.supervisor.children import RESTART_REASONS
from brooq.vocabulary import State
from tests.system.harness import count, free_port, insert_jobs, wait_until
from tests.system.obs_helpers import (
    ROOT,
    Scrape,
    ensure_prometheus_tool,
    http_addr,
    request,
    scrape,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

ALERTS = ROOT / "monitoring" / "prometheus" / "brooq-alerts.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "brooq-dashboard.json"
FAST = ("--poll-interval", "200ms", "--graceful-timeout", "3s")
TOPICS = ("hung", "poison", "work")  # the kinds apps/sysapp.py registers
REASONS = (
    "crash",
    "hung",
    "max_execution",
    "lease_ending",
    "broken",
    "max_jobs",
    "max_memory",
    "reload",
)
PER_TOPIC = (
    "brooq_ready_oldest_age_seconds",
    "brooq_claimed_total",
    "brooq_attempt_duration_seconds_count",
    "brooq_attempt_duration_seconds_sum",
    "brooq_worker_busy",
    "brooq_hung_workers_total",
    "brooq_lease_lost_total",
    "brooq_requeued_total",
    "brooq_retention_deleted_total",
)
# Panels that must show data once jobs ran (the others read counters still at zero or absent).
PANELS_WITH_DATA = {
    "Oldest ready job age (SLO)",
    "Queue depth by state",
    "Outcomes per second",
    "Busy worker slots",
    "Mean attempt duration",
    "p95 attempt duration",
}


def prometheus_config(target: str, path: Path) -> Path:
    """A config scraping ``target`` every second and loading brooq's rules."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "brooq", "static_configs": [{"targets": [target]}]}],
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@contextlib.contextmanager
def prometheus(workdir: Path, target: str) -> Iterator[str]:
    """A Prometheus on a free loopback port; its base URL. Always stopped afterwards."""
    binary = ensure_prometheus_tool("prometheus")
    port = free_port()
    config = prometheus_config(target, workdir / "prometheus.yml")
    log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: ready(base) or proc.poll() is not None, 30, "Prometheus ready")
        assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-3000:]
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def ready(base: str) -> bool:
    try:
        return request(f"{base}/-/ready", timeout=1.0)[0] == 200
    except OSError:
        return False


def query(base: str, promql: str) -> dict[str, Any]:
    """The ``data`` of an instant query (asserting the query itself succeeded)."""
    status, body = request(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", (promql, body[:500])
    data: dict[str, Any] = answer["data"]
    return data


def scalar_sum(base: str, promql: str) -> float | None:
    result = query(base, promql)["result"]
    return float(result[0]["value"][1]) if result else None


def dashboard_queries() -> dict[str, list[str]]:
    """Every panel's expressions, with the dashboard variables filled in."""
    board = json.loads(DASHBOARD.read_text())
    return {
        p["title"]: [
            t["expr"].replace("$__rate_interval", "15s").replace("$topic", ".*")
            for t in p["targets"]
        ]
        for p in board["panels"]
    }


def missing_at_start(page: Scrape) -> list[str]:
    """Every series of the documented metrics that is known at start and absent (or not 0)."""
    wanted: list[tuple[str, dict[str, str]]] = [("brooq_workers", {})]
    for topic in TOPICS:
        wanted += [(name, {"topic": topic}) for name in PER_TOPIC]
        wanted.append(("brooq_attempt_duration_seconds_bucket", {"topic": topic, "le": "+Inf"}))
        wanted += [("brooq_jobs", {"topic": topic, "state": str(s)}) for s in State]
        wanted += [("brooq_settle_total", {"topic": topic, "outcome": o}) for o in OUTCOMES]
    wanted += [("brooq_worker_restarts_total", {"reason": r}) for r in REASONS]
    missing = [f"{name}{labels}" for name, labels in wanted if not page.matching(name, **labels)]
    nonzero = [
        f"{name}{labels}"
        for name, labels in wanted
        if name != "brooq_workers" and page.value(name, **labels) != 0
    ]
    return missing + [f"{n} is not 0" for n in nonzero]


def rules_health(base: str) -> dict[str, str]:
    status, body = request(f"{base}/api/v1/rules")
    assert status == 200
    groups = json.loads(body)["data"]["groups"]
    return {r["name"]: r["health"] for g in groups for r in g["rules"]}


@pytest.mark.timeout(120)
def test_prometheus_scrapes_the_supervisor_and_runs_rules_and_dashboard(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    total = 200
    sup = supervise("--workers", "2", *FAST)
    target = http_addr(sup)
    # The very first scrape, before any job: every series known at start is there at 0, so an
    # increase() alert sees the first event (they used to appear on their first increment).
    assert set(REASONS) == set(RESTART_REASONS)
    assert missing_at_start(scrape(target)) == []
    sup.wait_children(2)
    with prometheus(tmp_path, target) as base:
        for name, n in [
            ("brooq_hung_workers_total", 3),
            ("brooq_lease_lost_total", 3),
            ("brooq_requeued_total", 3),
            ("brooq_retention_deleted_total", 3),
            ("brooq_worker_restarts_total", len(REASONS)),
        ]:
            zeros = f"count({name} == 0)"
            wait_until(
                lambda: scalar_sum(base, zeros) == n,  # noqa: B023 (waited for here)
                20,
                f"Prometheus to see {n} series of {name} at 0",
            )
        insert_jobs(pg, "work", [None] * total)
        wait_until(lambda: count(pg, "state = 'done'") == total, 60, "200 jobs done")
        done = 'sum(brooq_settle_total{outcome="done"})'
        wait_until(lambda: scalar_sum(base, done) == total, 30, f"Prometheus to see {total}")
        assert scalar_sum(base, 'up{job="brooq"}') == 1
        # The database gauges are cached 5 s (and the first scrape above read an empty table).
        jobs_done = 'sum(brooq_jobs{state="done"})'
        wait_until(lambda: scalar_sum(base, jobs_done) == total, 15, "the gauges to follow")
        assert scalar_sum(base, "sum(brooq_claimed_total)") == total

        health = wait_until(
            lambda: (h := rules_health(base)) and "unknown" not in h.values() and h,
            20,
            "every rule evaluated",
        )
        assert set(health) == {
            "BrooqQueueStalled",
            "BrooqJobsDying",
            "BrooqHungHandlers",
            "BrooqLeasesLost",
            "BrooqWorkersRestarting",
            "BrooqTargetDown",
        }
        assert set(health.values()) == {"ok"}, health

        # Every panel's query is valid PromQL; the main ones show data once rate() has
        # two samples of the new series.
        def panels_without_data() -> set[str]:
            empty = set()
            for title, exprs in dashboard_queries().items():
                if not any([query(base, e)["result"] for e in exprs]):
                    empty.add(title)
            return empty & PANELS_WITH_DATA

        wait_until(lambda: not panels_without_data(), 20, "data in every main panel", interval=0.5)
    assert sup.stop() == 0
