"""Settings of what a job carries, and of enqueueing: the largest payload and result,
whether an enqueue wakes idle workers, and the app version jobs are stamped with."""

from __future__ import annotations

from brooq.config import values as v
from brooq.config.settings.key import SUPERVISE, WORK, Key, KeyTable
from brooq.vocabulary.payload import MAX_PAYLOAD_BYTES_LIMIT
from brooq.vocabulary.result import MAX_RESULT_BYTES_LIMIT


class EnqueueKeys(KeyTable):
    """QUEUE_MAX_PAYLOAD_BYTES, QUEUE_MAX_RESULT_BYTES, QUEUE_NOTIFY and QUEUE_APP_VERSION."""

    max_payload_bytes: Key[int] = Key(
        "QUEUE_MAX_PAYLOAD_BYTES",
        v.size(
            zero_ok=False,
            at_most=MAX_PAYLOAD_BYTES_LIMIT,
            why=", the most a job can carry to its worker",
        ),
        "1MiB",
        "Largest accepted payload (encoded JSON; at most 16MiB).",
        section="enqueue",
    )
    max_result_bytes: Key[int] = Key(
        "QUEUE_MAX_RESULT_BYTES",
        v.size(
            zero_ok=False,
            at_most=MAX_RESULT_BYTES_LIMIT,
            why=", the most a result can carry from its worker",
        ),
        "1MiB",
        "Largest result a handler may return (encoded JSON; at most 16MiB); a larger one fails "
        "the attempt with ResultTooLarge.",
        section="enqueue",
    )
    notify: Key[bool] = Key(
        "QUEUE_NOTIFY",
        v.BOOL,
        "true",
        "NOTIFY on enqueue so idle workers wake at once (true/false).",
        section="enqueue",
    )
    app_version: Key[str | None] = Key(
        "QUEUE_APP_VERSION",
        v.APP_VERSION,
        None,
        "The version of the app's code (a release name or git sha, set by the deploy): "
        "jobs are stamped with it and a supervisor claims only jobs of its own version and "
        "jobs with none. Empty: unversioned (every job unversioned, as before versions).",
        section="enqueue",
        example="2026.12.05 or a git sha",
        commands=(SUPERVISE, WORK),
    )
