"""The gauge families read from the database at a scrape (brooq.metrics.DatabaseCollector):
rate limits' buckets, paused topics, jobs waiting per app version."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from brooq.engine.inspection import TopicRate, VersionCount


def rate_families(rates: Sequence[TopicRate]) -> Iterator[Any]:
    """``brooq_rate_tokens{topic}`` and ``brooq_rate_keys_waiting{topic}`` of every
    rate-limited topic the database has a bucket for."""
    from prometheus_client.core import GaugeMetricFamily

    tokens = GaugeMetricFamily(
        "brooq_rate_tokens",
        "Tokens the topic's rate limit bucket holds now (jobs without a rate_key).",
        labels=["topic"],
    )
    waiting = GaugeMetricFamily(
        "brooq_rate_keys_waiting",
        "Keys (rate_key) of the topic whose bucket holds no whole token now.",
        labels=["topic"],
    )
    for rate in rates:
        tokens.add_metric([rate.topic], rate.tokens)
        waiting.add_metric([rate.topic], rate.keys_waiting)
    yield tokens
    yield waiting


def paused_family(topics: set[str], paused: set[str]) -> Any:
    """``brooq_topic_paused{topic}``: 1 for a paused topic (brooq topics pause), 0 for every
    other topic served."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(
        "brooq_topic_paused",
        "1 while the topic is paused (no claimer starts its jobs), 0 otherwise.",
        labels=["topic"],
    )
    for topic in sorted(topics):
        family.add_metric([topic], 1 if topic in paused else 0)
    return family


def version_family(versions: Sequence[VersionCount]) -> Any:
    """``brooq_jobs_waiting_by_version{topic,app_version}``: jobs not started yet per app
    version (``""``: unversioned), so a deploy's dashboard shows the old version draining and
    an alert can catch jobs whose version no supervisor serves."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(
        "brooq_jobs_waiting_by_version",
        "Jobs not started yet (waiting, pending, failed) by topic and app version "
        '("": unversioned).',
        labels=["topic", "app_version"],
    )
    for row in versions:
        family.add_metric([row.topic, row.app_version or ""], row.jobs)
    return family
