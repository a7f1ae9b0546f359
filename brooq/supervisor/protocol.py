"""The child → parent pipe: one short text line per event, atomic under PIPE_BUF.

``B`` booted · ``C <job_id> <attempt> <topic>`` claimed · ``F <job_id> <label>``
finished (label: done, failed, …, or ``unsettled`` when the outcome could not
be written) · ``X <reason>`` leaving to be recycled.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

MAX_LINE = 512


@dataclass(frozen=True, slots=True)
class Booted:
    """The child is set up and about to claim."""


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """The child claimed a job and starts its handler."""

    job_id: str
    attempt: int
    topic: str


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """The child is done with a job (``label`` says how)."""

    job_id: str
    label: str


@dataclass(frozen=True, slots=True)
class Recycling:
    """The child exits on purpose to be replaced (max_jobs, max_memory)."""

    reason: str


Message = Booted | ClaimedJob | FinishedJob | Recycling


def encode(message: Message) -> bytes:
    """The line for ``message``."""
    match message:
        case Booted():
            line = "B"
        case ClaimedJob(job_id, attempt, topic):
            line = f"C {job_id} {attempt} {topic}"
        case FinishedJob(job_id, label):
            line = f"F {job_id} {label}"
        case Recycling(reason):
            line = f"X {reason}"
    return (line[: MAX_LINE - 1] + "\n").encode()


def decode(line: str) -> Message | None:
    """The message of one line; None for a line that is not one (ignored)."""
    parts = line.split()
    match parts:
        case ["B"]:
            return Booted()
        case ["C", job_id, attempt, topic] if attempt.isdigit():
            return ClaimedJob(job_id, int(attempt), topic)
        case ["F", job_id, label]:
            return FinishedJob(job_id, label)
        case ["X", reason]:
            return Recycling(reason)
    return None


class Reader:
    """Splits the bytes read from a child's pipe into messages."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def read(self) -> tuple[list[Message], bool]:
        """Messages available now, and whether the pipe reached EOF (the child is gone)."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return [], False
        if not chunk:
            return [], True
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        messages = [decode(line.decode(errors="replace")) for line in lines]
        return [m for m in messages if m is not None], False


def send(fd: int, message: Message) -> None:
    """Write ``message`` to the parent; a parent that is gone is not an error here."""
    with contextlib.suppress(OSError):
        os.write(fd, encode(message))
