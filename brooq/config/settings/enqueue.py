"""Settings of enqueueing: the largest payload, and whether an enqueue wakes idle workers."""

from __future__ import annotations

from brooq.config import values as v
from brooq.config.settings.key import Key, KeyTable
from brooq.vocabulary.payload import MAX_PAYLOAD_BYTES_LIMIT


class EnqueueKeys(KeyTable):
    """QUEUE_MAX_PAYLOAD_BYTES and QUEUE_NOTIFY."""

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
    notify: Key[bool] = Key(
        "QUEUE_NOTIFY",
        v.BOOL,
        "true",
        "NOTIFY on enqueue so idle workers wake at once (true/false).",
        section="enqueue",
    )
