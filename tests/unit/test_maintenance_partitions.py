"""The supervisor's maintenance creates partitions ahead, retention on or off, with the
interval of QUEUE_PARTITION_INTERVAL; and the setting's bounds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from brooq import metrics as prom
from brooq.config import load_settings
from brooq.config.values import ConfigError
from brooq.engine.fake import InMemoryStore
from brooq.supervisor.services import build_maintenance
from tests.conftest import Clock
from tests.unit.test_supervisor_services import InlineDatabase


@pytest.mark.parametrize("ttl", ["720h", "0"])
def test_partitions_are_made_ahead_whether_retention_is_on_or_off(clock: Clock, ttl: str) -> None:
    settings = load_settings(environ={"QUEUE_PARTITION_INTERVAL": "6h", "QUEUE_RETENTION_TTL": ttl})
    store, db = InMemoryStore(clock), InlineDatabase()
    maintenance = build_maintenance(
        settings, [], store=store, writes=db, metrics=prom.Metrics(registry=None)
    )
    assert maintenance.partitions.interval == timedelta(hours=6)
    assert maintenance.retention.partition_interval == timedelta(hours=6)
    assert "partitions" in maintenance.run_once(0.0)
    assert "partitions" not in maintenance.run_once(0.0)  # under way: not twice
    db.finish()
    # 3 intervals of 6h ahead of 2026-01-01 00:00, after the first range (up to 01-02).
    assert [name for name, _, _ in store.partitions] == ["job_initial"]
    clock.advance(timedelta(hours=23))
    maintenance.run_once(61.0)
    db.finish()
    assert [name for name, _, _ in store.partitions][1:] == [
        "job_p20260102_000000",
        "job_p20260102_060000",
        "job_p20260102_120000",
    ]


@pytest.mark.parametrize("text", ["59m", "0", "30s"])
def test_a_partition_interval_under_an_hour_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="QUEUE_PARTITION_INTERVAL"):
        load_settings(environ={"QUEUE_PARTITION_INTERVAL": text})


def test_the_partition_interval_defaults_to_a_day() -> None:
    assert load_settings(environ={}).partition_interval == timedelta(days=1)
