"""brooq's vocabulary: the words every layer shares. Standard library only."""

from brooq.vocabulary.claim import Claim, Lease, SettleHook
from brooq.vocabulary.durations import coerce_duration, format_duration, parse_duration
from brooq.vocabulary.errors import (
    BrooqError,
    EnqueueConflict,
    InvalidInput,
    InvalidJob,
    InvalidKindOptions,
    InvalidTopic,
    JobNotFound,
    KindNotRegistered,
    NeedsDatabase,
    PrivilegeMissing,
    SchemaMismatch,
    SchemaMissing,
    StoreUnavailable,
)
from brooq.vocabulary.handler_signals import (
    AttemptTimedOut,
    CancelJob,
    Delay,
    HandlerSignal,
    Interrupted,
    JobCanceledWhileRunning,
    LeaseLost,
    PreserveAttempt,
    find_signal,
)
from brooq.vocabulary.holder import holder_host, holder_id
from brooq.vocabulary.ids import new_job_id, new_job_ids, parse_job_id
from brooq.vocabulary.job import IDEMPOTENCY_KEY_MAX_LENGTH, Enqueued, Job, JobRecord
from brooq.vocabulary.options import BUILTIN_KIND_DEFAULTS, KindOptions
from brooq.vocabulary.payload import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    decode_payload,
    decode_stored_payload,
    encode_payload,
)
from brooq.vocabulary.ratelimit import MAX_RATE_COUNT, RateLimit, parse_rate_limit
from brooq.vocabulary.schedule import MISSED_RUNS, Schedule
from brooq.vocabulary.state import CLAIMABLE_STATES, TERMINAL_STATES, State
from brooq.vocabulary.topic import TOPIC_MAX_LENGTH, Topic, topic_problem

__all__ = [
    "BUILTIN_KIND_DEFAULTS",
    "CLAIMABLE_STATES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "MAX_RATE_COUNT",
    "MISSED_RUNS",
    "TERMINAL_STATES",
    "TOPIC_MAX_LENGTH",
    "AttemptTimedOut",
    "BrooqError",
    "CancelJob",
    "Claim",
    "Delay",
    "EnqueueConflict",
    "Enqueued",
    "HandlerSignal",
    "Interrupted",
    "InvalidInput",
    "InvalidJob",
    "InvalidKindOptions",
    "InvalidTopic",
    "Job",
    "JobCanceledWhileRunning",
    "JobNotFound",
    "JobRecord",
    "KindNotRegistered",
    "KindOptions",
    "Lease",
    "LeaseLost",
    "NeedsDatabase",
    "PreserveAttempt",
    "PrivilegeMissing",
    "RateLimit",
    "Schedule",
    "SchemaMismatch",
    "SchemaMissing",
    "SettleHook",
    "State",
    "StoreUnavailable",
    "Topic",
    "coerce_duration",
    "decode_payload",
    "decode_stored_payload",
    "encode_payload",
    "find_signal",
    "format_duration",
    "holder_host",
    "holder_id",
    "new_job_id",
    "new_job_ids",
    "parse_duration",
    "parse_job_id",
    "parse_rate_limit",
    "topic_problem",
]
