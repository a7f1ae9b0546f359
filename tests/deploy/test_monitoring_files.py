"""monitoring/: the alert rules pass promtool (syntax and unit tests), the example
Prometheus config is valid, and the Grafana dashboard loads and asks only for
metrics brooq exports.

promtool comes from the Debian package ``prometheus``; when it is missing the
test installs it (as root, as in CI) or fails: it is never skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.system.obs_helpers import ensure_prometheus_tool, exported_metric_names

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "monitoring" / "prometheus"
ALERTS = PROMETHEUS_DIR / "brooq-alerts.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "brooq-dashboard.json"

EXPECTED_ALERTS = {
    "BrooqQueueStalled",
    "BrooqJobsDying",
    "BrooqHungHandlers",
    "BrooqLeasesLost",
    "BrooqTargetDown",
    "BrooqWorkersRestarting",
}
# Names in PromQL that are not metrics: functions, keywords, Prometheus's own series.
PROMQL_WORDS = {
    "sum",
    "max",
    "min",
    "avg",
    "by",
    "without",
    "rate",
    "increase",
    "histogram_quantile",
    "on",
    "ignoring",
    "group_left",
    "up",
    "unless",
    "and",
    "or",
    "le",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (identifiers outside strings and braces)."""
    bare = re.sub(
        r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr
    )
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare)} - PROMQL_WORDS


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool in monitoring/prometheus (so relative rule paths resolve)."""
    tool = ensure_prometheus_tool("promtool")
    return subprocess.run(
        [tool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60
    )


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panel_exprs() -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard()["panels"]}


@pytest.mark.timeout(900)  # a first run may install the Debian package
def test_promtool_check_rules_passes() -> None:
    done = promtool("check", "rules", ALERTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


@pytest.mark.timeout(900)
def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    done = promtool("test", "rules", "brooq-alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(900)
def test_the_example_prometheus_config_is_valid_and_loads_the_rules() -> None:
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


def test_every_alert_is_there_with_for_labels_and_annotations() -> None:
    text = ALERTS.read_text()
    blocks = re.split(r"\n\s*- alert: ", text)[1:]
    names = {b.split()[0] for b in blocks}
    assert names == EXPECTED_ALERTS
    for block in blocks:
        assert "severity:" in block and "summary:" in block and "description:" in block, block
    timed = {b.split()[0] for b in blocks if re.search(r"\n\s+for: \d+m", b)}
    assert timed >= {
        "BrooqQueueStalled",
        "BrooqJobsDying",
        "BrooqTargetDown",
        "BrooqWorkersRestarting",
    }


def test_alert_expressions_read_only_exported_metrics() -> None:
    exported = exported_metric_names() | {"up"}
    exprs = re.findall(r"expr: (?:>-\n)?((?:.+\n)+?)\s+(?:for|labels):", ALERTS.read_text())
    assert len(exprs) == len(EXPECTED_ALERTS)
    for expr in exprs:
        names = metric_names(expr) | ({"up"} if "up{" in expr else set())
        assert names and names <= exported, (expr, names - exported)


def test_the_exported_names_are_the_ones_of_design_md() -> None:
    assert exported_metric_names() >= {
        "brooq_jobs",
        "brooq_ready_oldest_age_seconds",
        "brooq_claimed_total",
        "brooq_settle_total",
        "brooq_attempt_duration_seconds_bucket",
        "brooq_attempt_duration_seconds_sum",
        "brooq_attempt_duration_seconds_count",
        "brooq_worker_busy",
        "brooq_workers",
        "brooq_hung_workers_total",
        "brooq_lease_lost_total",
        "brooq_requeued_total",
        "brooq_retention_deleted_total",
        "brooq_worker_restarts_total",
    }


def test_the_dashboard_has_a_datasource_and_a_topic_variable() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    topic = variables["topic"]
    assert topic["type"] == "query"
    assert topic["definition"] == "label_values(brooq_jobs, topic)"
    assert topic["query"]["query"] == "label_values(brooq_jobs, topic)"
    assert topic["datasource"]["uid"] == "${datasource}"


def test_every_dashboard_panel_reads_only_exported_metrics() -> None:
    exported = exported_metric_names()
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names and names <= exported, (panel["title"], names - exported)


def test_the_dashboard_has_the_operations_panels() -> None:
    exprs = "\n".join(e for es in panel_exprs().values() for e in es)
    for needle in (
        "max by (topic) (brooq_ready_oldest_age_seconds",
        "sum by (topic, state) (brooq_jobs",
        "sum by (topic, outcome) (rate(brooq_settle_total",
        "rate(brooq_attempt_duration_seconds_sum",
        "rate(brooq_attempt_duration_seconds_count",
        "histogram_quantile(0.95, sum by (topic, le) (rate(brooq_attempt_duration_seconds_bucket",
        "sum by (topic) (brooq_worker_busy",
        "sum by (reason) (rate(brooq_worker_restarts_total",
        "rate(brooq_hung_workers_total",
        "rate(brooq_lease_lost_total",
    ):
        assert needle in exprs, needle
    selectors = re.findall(r"brooq_\w+\{[^}]*\}", exprs)
    by_topic = [s for s in selectors if not s.startswith("brooq_worker_restarts_total")]
    assert by_topic and all('topic=~"$topic"' in s for s in by_topic), selectors
