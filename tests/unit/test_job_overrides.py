"""A job's own options (``Job(max_attempts=…, attempt_timeout=…)``): checked as a kind's
options are, merged over its kind's where the job runs, and followed by the retry decision."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import brooq
from brooq.engine.fake import InMemoryStore
from brooq.engine.kinds import Registry
from brooq.engine.outcome import decide
from brooq.vocabulary import (
    BUILTIN_KIND_DEFAULTS,
    InvalidInput,
    InvalidJob,
    InvalidKindOptions,
    Job,
    KindOptions,
)

BAD = [
    {"max_attempts": 0},
    {"max_attempts": 1_000_001},
    {"max_attempts": "5"},
    {"max_attempts": True},
    {"attempt_timeout": "10"},
    {"attempt_timeout": "soon"},
    {"attempt_timeout": 0},
    {"max_execution_timeout": "-1s"},
    {"backoff_base": float("nan")},
    {"backoff_max": "400d"},
    {"attempt_timeout": "2m", "max_execution_timeout": "1m"},
    {"backoff_base": "1m", "backoff_max": "1s"},
]


@pytest.mark.parametrize("given", BAD, ids=lambda g: ",".join(f"{k}={v!r}" for k, v in g.items()))
def test_a_bad_override_is_refused_with_the_kind_options_message(given: dict[str, Any]) -> None:
    with pytest.raises(InvalidKindOptions) as kind:
        KindOptions(**given)
    with pytest.raises(InvalidJob) as job:
        Job("report", **given)
    assert str(job.value) == str(kind.value)
    assert isinstance(job.value, InvalidInput)  # the command line exits 2


def test_nothing_is_enqueued_when_a_job_is_refused() -> None:
    store = InMemoryStore()
    queue = brooq.Queue(store)
    with pytest.raises(InvalidJob, match="no unit"):
        queue.enqueue_many([Job("report"), Job("report", attempt_timeout="10")])
    assert store.rows == {}


def test_overrides_are_coerced_as_kind_options_are() -> None:
    job = Job("report", max_attempts=20, attempt_timeout="10s", backoff_base=0.5)
    assert job.attempt_timeout == timedelta(seconds=10)
    assert job.backoff_base == timedelta(milliseconds=500)
    assert job.overrides == KindOptions(max_attempts=20, attempt_timeout="10s", backoff_base=0.5)
    assert Job("report").overrides is None


def test_a_jobs_overrides_replace_only_what_they_set() -> None:
    kind = KindOptions(max_attempts=5, attempt_timeout="1m", max_execution_timeout="2m")
    full = kind.with_defaults(BUILTIN_KIND_DEFAULTS)
    merged = full.overridden_by(Job("r", max_attempts=1, backoff_max="1h").overrides)
    assert (merged.max_attempts, merged.backoff_max) == (1, timedelta(hours=1))
    assert merged.attempt_timeout == timedelta(minutes=1)
    assert full.overridden_by(None) is full


def test_an_override_is_not_checked_against_the_kinds_other_options() -> None:
    """A job's attempt_timeout may exceed its kind's max_execution_timeout: the hard limit
    then comes first; merging never raises where the job runs."""
    full = KindOptions(max_execution_timeout="1m").with_defaults(BUILTIN_KIND_DEFAULTS)
    merged = full.overridden_by(Job("r", attempt_timeout="10m", backoff_base="1h").overrides)
    assert merged.attempt_timeout == timedelta(minutes=10)
    assert merged.max_execution_timeout == timedelta(minutes=1)
    assert merged.backoff_base == timedelta(hours=1) > (merged.backoff_max or timedelta(0))


def test_registry_job_options_apply_overrides_to_a_kind_or_to_the_defaults() -> None:
    registry = Registry()
    registry.register("report", lambda claim: None, KindOptions(max_attempts=9))
    overrides = Job("x", max_attempts=2).overrides
    assert registry.job_options("report").max_attempts == 9
    assert registry.job_options("report", overrides).max_attempts == 2
    assert registry.job_options("unknown", overrides).max_attempts == 2
    assert registry.job_options("unknown").max_attempts == BUILTIN_KIND_DEFAULTS.max_attempts


def test_the_decision_follows_the_jobs_max_attempts_and_backoff() -> None:
    kind = KindOptions(max_attempts=5, backoff_base="1s", backoff_max="1m")
    options = kind.with_defaults(BUILTIN_KIND_DEFAULTS)
    error = RuntimeError("boom")
    assert decide(error, 1, options).label == "failed"
    job = options.overridden_by(Job("r", max_attempts=1).overrides)
    assert decide(error, 1, job).label == "dead"
    slow = options.overridden_by(Job("r", backoff_base="10m", backoff_max="1h").overrides)
    assert decide(error, 3, slow, rand=lambda: 0.0).retry_in == timedelta(minutes=20)  # d/2, d=40m
    assert decide(brooq.Delay(7200), 1, slow).retry_in == timedelta(hours=1)  # clamped


def test_the_in_memory_store_runs_a_job_by_its_own_options() -> None:
    queue = brooq.Queue(InMemoryStore())
    seen: list[brooq.Claim] = []

    @queue.kind("report", max_attempts=5, attempt_timeout="1m")
    def report(claim: brooq.Claim) -> None:
        seen.append(claim)
        raise ValueError("no data")

    once = queue.enqueue(Job("report", max_attempts=1, attempt_timeout="2h")).id
    drained = queue.drain()
    assert drained.outcomes == {"dead": 1} and queue.get(once).state == brooq.State.DEAD
    assert seen[0].max_attempts == 1 and seen[0].is_last_attempt
    assert seen[0].deadline is not None
    assert seen[0].deadline - seen[0].lease.until > timedelta(minutes=90)  # lease is 5 min


@pytest.mark.parametrize(
    ("carrier", "message"),
    [
        ({"traceparent": 1}, "must map text to text"),
        (["traceparent"], "must map text to text"),
        ({"k": "x" * 5000}, "above the limit of 4096"),
        ({"k": "\x00"}, "NUL"),
    ],
)
def test_a_bad_trace_context_is_refused(carrier: Any, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        Job("report", trace_context=carrier)


def test_a_record_shows_its_durations_with_units() -> None:
    store = InMemoryStore()
    (done,) = store.enqueue_many([Job("report", max_attempts=3, max_execution_timeout="90s")])
    row = store.get(done.id).as_dict()
    assert (row["max_attempts"], row["max_execution_timeout"], row["backoff_max"]) == (
        3,
        "1m30s",
        None,
    )
