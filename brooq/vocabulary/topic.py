"""Topics name kinds of jobs: lowercase words separated by dots or dashes."""

from __future__ import annotations

import re

from brooq.vocabulary.errors import InvalidTopic

TOPIC_MAX_LENGTH = 128
_TOPIC_RE = re.compile(r"[a-z0-9_]+(?:[.-][a-z0-9_]+)*")
_KNOWN: dict[str, Topic] = {}
"""Topics checked already, by text (a topic is valid or not by its text alone): a bulk
enqueue checks each of its few topics once, not once a job."""
_KNOWN_MOST = 4096


class Topic(str):
    """A validated topic such as ``email.send`` or ``report-daily``.

    Construction raises :class:`InvalidTopic` with a message saying what to
    write instead; a ``Topic`` is otherwise a plain ``str``.
    """

    __slots__ = ()

    def __new__(cls, value: object) -> Topic:
        if type(value) is str and (known := _KNOWN.get(value)) is not None:
            return known
        if isinstance(value, Topic):
            return value
        if not isinstance(value, str):
            raise InvalidTopic(f"topic must be a string, not {type(value).__name__}")
        problem = topic_problem(value)
        if problem:
            raise InvalidTopic(problem)
        topic = super().__new__(cls, value)
        if len(_KNOWN) < _KNOWN_MOST:
            _KNOWN[str(value)] = topic
        return topic


def topic_problem(value: str) -> str | None:
    """Return why ``value`` is not a valid topic, or None when it is one."""
    if value == "":
        return "topic is empty; write lowercase words separated by dots or dashes, e.g. email.send"
    shown = value if len(value) <= 40 else value[:40] + "…"
    if len(value) > TOPIC_MAX_LENGTH:
        return f"topic {shown!r} is longer than {TOPIC_MAX_LENGTH} characters"
    if _TOPIC_RE.fullmatch(value) is None:
        return (
            f"topic {shown!r} is invalid: use lowercase letters, digits and underscores "
            "in words separated by single dots or dashes, e.g. email.send"
        )
    return None
