"""Paused topics: what an operator stopped, why, when and who.

A paused topic starts no new job on any claimer until it is resumed; its jobs can
still be enqueued, listed, canceled and retried, and wait as ``pending`` meanwhile.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from datetime import datetime

from brooq.vocabulary.errors import InvalidInput
from brooq.vocabulary.topic import Topic

PAUSE_REASON_MAX_CHARS = 500
"""The longest reason a pause may carry (it is shown on one line by status and the
dashboard)."""


@dataclass(frozen=True, slots=True)
class TopicPause:
    """A paused topic: since when (the database's clock), by whom, and why (None: no
    reason given)."""

    topic: str
    reason: str | None
    paused_at: datetime
    paused_by: str


def pause_request(topic: str, reason: str | None) -> tuple[Topic, str | None]:
    """The checked topic and reason of a pause: InvalidTopic for a name that is not a
    topic, InvalidInput for a reason that is too long or not one line; an empty reason is
    none."""
    checked = Topic(topic)
    if reason is None:
        return checked, None
    if not isinstance(reason, str):
        raise InvalidInput(f"a pause's reason must be text, not {type(reason).__name__}")
    reason = reason.strip()
    if len(reason) > PAUSE_REASON_MAX_CHARS:
        raise InvalidInput(
            f"the reason is {len(reason)} characters long; keep it to "
            f"{PAUSE_REASON_MAX_CHARS} (link to the incident rather than pasting it)"
        )
    if any(c in reason for c in "\r\n\x00"):
        raise InvalidInput("the reason must be one line of text (no line breaks or NUL)")
    return checked, reason or None


def pause_author() -> str:
    """Who pauses, when nobody says: ``user@host`` of this process (``uid N`` for a user
    without a name, as in some containers)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"
