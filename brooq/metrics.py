"""Prometheus metrics across all of a supervisor's processes (multiprocess mode).

The supervisor makes a private directory (0700, emptied at start, removed at
exit) before prometheus_client builds any metric. Every process writes its
own files there under a *metrics id* rather than its pid: ``supervisor`` for
the parent, ``w<k>`` for a child, where k is reused only after the parent
has reaped the previous holder. So the file count stays at about N however
many children come and go, and a dead child's counters live on in the files
its successor continues.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from brooq.engine.inspection import Inspection, TopicRate, TopicStateCount, VersionCount
from brooq.gauges import paused_family, rate_families, version_family
from brooq.osproc import no_fork
from brooq.vocabulary.state import State

_identity: dict[str, str | None] = {"id": None}

DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


def process_identifier() -> str:
    """The metrics id of this process (its pid until one is assigned)."""
    return _identity["id"] or f"pid{os.getpid()}"


def set_identity(metrics_id: str) -> None:
    """Write this process's metrics to files named after ``metrics_id`` from now on."""
    _identity["id"] = metrics_id


def create_directory() -> str:
    """A fresh private directory for the multiprocess files, set in the environment.

    Must run before prometheus_client creates any metric (the app is imported
    after it).
    """
    remove_stale_directories()
    path = tempfile.mkdtemp(prefix=f"brooq-metrics-{os.getpid()}-")
    os.chmod(path, 0o700)
    hold_directory(path)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    set_identity("supervisor")
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue(process_identifier)  # type: ignore[no-untyped-call]
    return path


OWNER_FILE = ".owner"
_held: list[int] = []
"""The descriptor that holds this supervisor's lock on its directory (kept open)."""


def hold_directory(path: str) -> None:
    """Lock ``path``'s owner file for as long as this process (and its workers) live.

    The lock, not the pid in the name, says a directory is in use: a pid means
    nothing across PID namespaces (containers sharing /tmp, ``unshare``), a lock
    on the same file does.
    """
    fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held.append(fd)


def remove_stale_directories() -> None:
    """Remove the directories of supervisors that died without cleaning up (kill -9).

    Only directories of this user whose owner lock nobody holds any more.
    """
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "brooq-metrics-*-*")):
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # gone, or not a directory brooq locks: leave it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live supervisor (or one of its workers) holds it
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def remove_directory(path: str) -> None:
    """Delete the directory at exit."""
    shutil.rmtree(path, ignore_errors=True)


def mark_dead(metrics_id: str) -> None:
    """Drop the live gauges of a process that ended (its counters stay)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(metrics_id)  # type: ignore[no-untyped-call]


OUTCOMES = ("done", "failed", "delayed", "preserved", "dead", "canceled")
"""Every ``outcome`` label of brooq_settle_total."""


_DEFAULT: Any = object()
"""Metrics() registers in prometheus_client's default registry unless told otherwise."""


class Metrics:
    """brooq's metrics, with the names and labels of the design.

    Counters live in the multiprocess files; the gauges of what the workers
    do now (``brooq_workers``, ``brooq_worker_busy``) are read from the
    supervisor at scrape time (:class:`WorkersCollector`).
    """

    def __init__(self, registry: Any = _DEFAULT) -> None:
        """``registry``: where the metrics are registered (prometheus_client's default;
        None for the metrics of a unit test, registered nowhere)."""
        from prometheus_client import REGISTRY, Counter, Histogram

        r = REGISTRY if registry is _DEFAULT else registry

        def counter(name: str, help: str, label: str, *more: str) -> Counter:
            return Counter(name, help, [label, *more], registry=r)

        self.claimed = counter("brooq_claimed_total", "Jobs claimed (attempts started).", "topic")
        self.settled = counter(
            "brooq_settle_total", "Attempt outcomes written.", "topic", "outcome"
        )
        self.duration = Histogram(
            "brooq_attempt_duration_seconds",
            "Duration of attempts, claim to settle.",
            ["topic"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.hung = counter(
            "brooq_hung_workers_total",
            "Workers SIGKILLed because a handler did not exit after an interrupt.",
            "topic",
        )
        self.lease_lost = counter(
            "brooq_lease_lost_total",
            "Running jobs whose lease was lost (canceled or taken).",
            "topic",
        )
        self.requeued = counter(
            "brooq_requeued_total", "Jobs returned by the reaper (expired lease).", "topic"
        )
        self.retention_deleted = counter(
            "brooq_retention_deleted_total", "Terminal rows deleted by retention.", "topic"
        )
        self.rate_limited = counter(
            "brooq_rate_limited_total",
            "Claims a rate limit cut short (ready jobs left, no token for them).",
            "topic",
        )
        self.restarts = counter(
            "brooq_worker_restarts_total", "Worker processes replaced, by reason.", "reason"
        )
        self.periodic = counter(
            "brooq_periodic_enqueued_total",
            "Runs of periodic schedules enqueued (by this supervisor).",
            "schedule",
        )

    def initialise(
        self, topics: Sequence[str], restart_reasons: Sequence[str], schedules: Sequence[str] = ()
    ) -> None:
        """Export every series known at start at zero, so increase() sees the first event."""
        for topic in topics:
            for counter in (
                self.claimed,
                self.hung,
                self.lease_lost,
                self.requeued,
                self.retention_deleted,
                self.rate_limited,
            ):
                counter.labels(topic=topic)
            for outcome in OUTCOMES:
                self.settled.labels(topic=topic, outcome=outcome)
            self.duration.labels(topic=topic)
        for reason in restart_reasons:
            self.restarts.labels(reason=reason)
        for name in schedules:
            self.periodic.labels(schedule=name)


Topics = Sequence[str] | Callable[[], Sequence[str]]
"""The topics a collector exports at zero: fixed, or read at each scrape (a supervisor's
change with a SIGHUP reload)."""


def served(topics: Topics) -> list[str]:
    """The topics of ``topics`` now."""
    return list(topics() if callable(topics) else topics)


class WorkersCollector:
    """``brooq_workers``, ``brooq_worker_busy{topic}`` and ``brooq_app_version_info{app_version}``
    (1, ``""``: unversioned) from the supervisor's own view.

    ``read`` returns (worker processes running, busy workers per topic); the
    supervisor's loop keeps that snapshot current, so a scrape costs nothing. The
    version's series joins the counters of a supervisor to the version it claims.
    """

    def __init__(
        self,
        read: Callable[[], tuple[int, dict[str, int]]],
        topics: Topics,
        app_version: str | None = None,
    ) -> None:
        self.read, self._topics, self.app_version = read, topics, app_version

    @property
    def topics(self) -> list[str]:
        """The topics served now (a reload may add some)."""
        return served(self._topics)

    def collect(self) -> Iterator[Any]:
        """Yield the two gauge families."""
        from prometheus_client.core import GaugeMetricFamily

        workers, busy = self.read()
        yield GaugeMetricFamily("brooq_workers", "Worker processes running.", value=workers)
        family = GaugeMetricFamily(
            "brooq_worker_busy", "Worker slots running a job.", labels=["topic"]
        )
        for topic in sorted(set(self.topics) | set(busy)):
            family.add_metric([topic], busy.get(topic, 0))
        yield family
        version = GaugeMetricFamily(
            "brooq_app_version_info",
            "The app version this supervisor claims.",
            labels=["app_version"],
        )
        version.add_metric([self.app_version or ""], 1)
        yield version


class DatabaseCollector:
    """``brooq_jobs``, ``brooq_ready_oldest_age_seconds``, the rate limits' tokens and
    ``brooq_topic_paused``, read at scrape time.

    Four small queries through the Inspection port (under its statement time
    limit), cached for ``ttl_s`` so a burst of scrapes costs the database one
    read. Thread-safe: concurrent scrapes (the surface serves each in its own
    thread) wait at most ``wait_s`` for the one read in progress instead of each
    running its own. Nothing is yielded while the database cannot answer.
    """

    def __init__(
        self, inspection: Inspection, topics: Topics, ttl_s: float = 5.0, wait_s: float = 1.0
    ) -> None:
        self.inspection, self._topics = inspection, topics
        self.ttl_s, self.wait_s = ttl_s, wait_s
        self._cached: tuple[float, Read] | None = None
        self._reading = threading.Lock()

    @property
    def topics(self) -> list[str]:
        """The topics served now (a reload may add some)."""
        return served(self._topics)

    def _fresh(self) -> Read | None:
        cached = self._cached
        if cached is None or time.monotonic() - cached[0] > self.ttl_s:
            return None
        return cached[1]

    def _values(self) -> Read:
        if (values := self._fresh()) is not None:
            return values
        if not self._reading.acquire(timeout=self.wait_s):
            raise TimeoutError("another scrape is still reading the database")
        try:
            if (values := self._fresh()) is None:
                with no_fork():
                    values = (
                        self.inspection.depth(),
                        self.inspection.oldest_ready(),
                        self.inspection.rate_limits(),
                        {p.topic for p in self.inspection.pauses()},
                        self.inspection.pending_by_version(),
                    )
                self._cached = (time.monotonic(), values)
            return values
        finally:
            self._reading.release()

    def collect(self) -> Iterator[Any]:
        """Yield the gauge families; nothing when the database is unreachable."""
        from prometheus_client.core import GaugeMetricFamily

        try:
            depth, oldest, rates, paused, versions = self._values()
        except Exception:
            return
        jobs = GaugeMetricFamily(
            "brooq_jobs", "Jobs by topic and state.", labels=["topic", "state"]
        )
        # Every state of every registered topic, at zero when it has no rows.
        counts = {(topic, str(state)): 0 for topic in self.topics for state in State}
        counts.update({(row.topic, row.state): row.jobs for row in depth})
        for (topic, state), n in sorted(counts.items()):
            jobs.add_metric([topic, state], n)
        age = GaugeMetricFamily(
            "brooq_ready_oldest_age_seconds",
            "How long the oldest ready job has waited (0: none ready).",
            labels=["topic"],
        )
        for topic in sorted(set(self.topics) | {r.topic for r in depth}):
            age.add_metric([topic], oldest.get(topic, 0.0))
        yield jobs
        yield age
        yield from rate_families(rates)
        yield paused_family(set(self.topics) | paused, paused)
        yield version_family(versions)


Read = tuple[list[TopicStateCount], dict[str, float], list[TopicRate], set[str], list[VersionCount]]
"""What one database read of the collector holds."""


def render(collectors: Sequence[Any], supervisor_pid: int) -> bytes:
    """The /metrics page: every process's files, ``collectors``, process_* of the parent."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(pid=lambda: supervisor_pid, registry=registry)
    return generate_latest(registry)
