"""A Job checks every field it is given and reads back every field it is not.

Issue 32: ``Job.__init__`` stores only the fields that differ from their defaults (a
bulk enqueue makes thousands of jobs a second); every check, its message and its order
stay what they were, and a job reads, compares, copies and pickles as before.
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brooq.vocabulary import InvalidJob, InvalidTopic, Job
from brooq.vocabulary.job import plain_jobs

PARENT = "01900000-0000-7000-8000-000000000001"
DEFAULTS: dict[str, Any] = {
    "payload": None,
    "idempotency_key": None,
    "available_at": None,
    "priority": 0,
    "rate_key": None,
    "after": (),
    "if_parent_fails": "cancel",
    "max_attempts": None,
    "attempt_timeout": None,
    "max_execution_timeout": None,
    "backoff_base": None,
    "backoff_max": None,
    "trace_context": None,
}


class Level(enum.IntEnum):
    HIGH = 5


def test_a_job_given_only_a_topic_reads_every_default() -> None:
    job = Job("email.send")
    assert {name: getattr(job, name) for name in DEFAULTS} == DEFAULTS
    assert job.topic == "email.send" and job.overrides is None and job.after_ids == ()
    assert [f.name for f in dataclasses.fields(Job)][: len(DEFAULTS) + 1] == [
        "topic",
        *DEFAULTS,
    ]


def test_defaults_given_or_not_make_equal_jobs_that_copy_and_pickle() -> None:
    explicit = Job("t", {"a": 1}, **{k: v for k, v in DEFAULTS.items() if k != "payload"})
    implicit = Job("t", {"a": 1})
    assert explicit == implicit and repr(explicit) == repr(implicit)
    assert Job("t", 1, idempotency_key="", rate_key="") == Job("t", 1)  # "" is none
    full = Job(
        "t",
        [1],
        idempotency_key="k",
        available_at=datetime(2030, 1, 1, tzinfo=UTC),
        priority=-3,
        rate_key="tenant",
        after=[PARENT, PARENT],
        if_parent_fails="run",
        max_attempts=4,
        attempt_timeout="10s",
        trace_context={"traceparent": "x"},
    )
    assert full.after == (PARENT,) and full.attempt_timeout == timedelta(seconds=10)
    assert full.overrides is not None and full.overrides.max_attempts == 4
    for copy in (pickle.loads(pickle.dumps(full)), dataclasses.replace(full)):
        assert copy == full and copy.overrides == full.overrides
    assert dataclasses.replace(full, priority=2).priority == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.priority = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        implicit.rate_key = "r"  # type: ignore[misc]  # a field still at its default


def test_a_priority_of_an_int_subclass_is_kept_as_given() -> None:
    assert Job("t", priority=Level.HIGH).priority is Level.HIGH
    assert Job("t", priority=-32768).priority == -32768


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"topic": ""}, InvalidTopic, "topic is empty"),
    ({"topic": 7}, InvalidTopic, "must be a string"),
    ({"after": PARENT}, InvalidJob, "after must be a list of job ids"),
    ({"after": ["nope"]}, InvalidJob, "after"),
    ({"if_parent_fails": "skip"}, InvalidJob, "if_parent_fails must be 'cancel' or 'run'"),
    ({"idempotency_key": 7}, InvalidJob, "idempotency_key must be a string, not int"),
    ({"idempotency_key": "k" * 513}, InvalidJob, "above the limit of 512"),
    ({"idempotency_key": "a\x00"}, InvalidJob, "idempotency_key holds a NUL"),
    ({"idempotency_key": "\ud800"}, InvalidJob, "lone surrogate"),
    ({"rate_key": b"r"}, InvalidJob, "rate_key must be a string, not bytes"),
    ({"rate_key": "r\x00"}, InvalidJob, "rate_key holds a NUL"),
    ({"priority": True}, InvalidJob, "priority must be an integer from -32768 to 32767"),
    ({"priority": False}, InvalidJob, r"got False"),
    ({"priority": 0.0}, InvalidJob, r"got 0\.0"),
    ({"priority": "1"}, InvalidJob, "priority must be an integer"),
    ({"priority": 32768}, InvalidJob, "got 32768"),
    ({"available_at": "2030-01-01"}, InvalidJob, "available_at must be a datetime, not str"),
    ({"available_at": datetime(2030, 1, 1)}, InvalidJob, "timezone-aware"),
    ({"max_attempts": 0}, InvalidJob, "max_attempts: must be at least 1"),
    ({"attempt_timeout": "30"}, InvalidJob, "attempt_timeout"),
    ({"trace_context": {"a": 1}}, InvalidJob, "trace_context must map text to text"),
]


@pytest.mark.parametrize(("given", "error", "message"), BAD)
def test_every_bad_value_is_refused_with_its_message(
    given: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Job(**{"topic": "ok", **given})


ORDER: list[tuple[str, Any, str]] = [  # as __post_init__ checked them
    ("topic", "", "topic is empty"),
    ("after", PARENT, "after must be"),
    ("if_parent_fails", "skip", "if_parent_fails must be"),
    ("idempotency_key", 7, "idempotency_key must be"),
    ("rate_key", b"r", "rate_key must be"),
    ("priority", True, "priority must be"),
    ("available_at", "2030", "available_at must be"),
    ("max_attempts", 0, "max_attempts: must be"),
    ("trace_context", {"a": 1}, "trace_context must"),
]


def test_of_several_bad_fields_the_first_in_the_old_order_is_reported() -> None:
    for i, (_, _, message) in enumerate(ORDER):
        given = {name: value for name, value, _ in ORDER[i:]}
        with pytest.raises((InvalidJob, InvalidTopic), match=message):
            Job(**given) if "topic" in given else Job("ok", **given)


def test_plain_jobs_are_those_that_set_only_a_topic_and_a_payload() -> None:
    plain = [Job("t"), Job("t", {"a": 1}), Job("t", 0, idempotency_key="", priority=0)]
    assert plain_jobs(plain) and plain_jobs([])
    assert plain_jobs([Job("t", rate_key="", if_parent_fails="cancel", after=())])
    at = datetime(2030, 1, 1, tzinfo=UTC)
    for other in (
        Job("t", priority=1),
        Job("t", priority=Level.HIGH),
        Job("t", {"a": 1}, rate_key="r"),
        Job("t", idempotency_key="k"),
        Job("t", available_at=at),
        Job("t", after=[PARENT]),
        Job("t", after=[]),  # normalised to (), but given: not told at a glance
        Job("t", if_parent_fails="run"),
        Job("t", max_attempts=3),
        Job("t", trace_context={"traceparent": "x"}),
    ):
        assert not plain_jobs([*plain, other]), other


@dataclasses.dataclass(frozen=True)
class Tagged(Job):
    tag: str = ""


def test_a_dataclass_subclass_is_checked_and_normalised_as_a_job() -> None:
    job = Tagged("t", {"a": 1}, after=[PARENT, PARENT], idempotency_key="", tag="x")
    assert (job.after, job.idempotency_key, job.tag) == ((PARENT,), None, "x")
    assert Tagged("t", attempt_timeout=timedelta(seconds=10)).overrides is not None
    with pytest.raises(InvalidTopic, match="invalid"):
        Tagged("Bad")
    with pytest.raises(InvalidJob, match="priority must be"):
        Tagged("t", priority=True)
    assert dataclasses.replace(job, tag="y").tag == "y"
    assert not plain_jobs([Tagged("t")])  # told field by field
