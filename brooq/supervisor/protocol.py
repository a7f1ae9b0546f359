"""Parent ↔ worker messages over a socket pair: length-prefixed JSON frames.

Parent → worker: ``Assign`` (a claimed job for the worker's queue, with its
sequence number), ``Stop`` (start nothing more, leave). Worker → parent:
``Booted``, ``Finished`` (the decided outcome, or a settle the worker wrote
itself because the job had effects). A job the worker never started is
known to the parent from the worker's board (board.py), so a worker that
leaves or dies says nothing of its queue. A frame is a 4-byte big-endian
length and a JSON array whose first item names the message. Anything that
does not decode is a protocol error: the parent treats that worker as broken.
"""

from __future__ import annotations

import json
import os
import select
import struct
from dataclasses import dataclass
from datetime import datetime, timedelta

from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.store import Claimed, Ticket

MAX_FRAME = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a message: it is broken or not a brooq process."""


@dataclass(frozen=True, slots=True)
class Booted:
    """The worker is set up and waits for jobs."""


@dataclass(frozen=True, slots=True)
class Assign:
    """Run this claimed job after those sent before it (``seq`` counts up per worker)."""

    seq: int
    claimed: Claimed


@dataclass(frozen=True, slots=True)
class Stop:
    """Start no more jobs: finish the running one (if any), then leave."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The worker is done with a job.

    ``written`` is None when the parent writes ``outcome`` (a plain outcome,
    for the completer); True or False when the worker settled the job itself
    (it had chained jobs or hooks) and whether its write matched.
    ``leaving`` names why the worker exits now (max_jobs, max_memory,
    stopping), or is None.
    """

    seq: int
    ticket: Ticket
    outcome: Outcome
    duration_s: float
    written: bool | None = None
    leaving: str | None = None


Message = Booted | Assign | Stop | Finished


def _outcome_fields(o: Outcome) -> list[object]:
    retry = None if o.retry_in is None else o.retry_in.total_seconds()
    return [str(o.kind), o.label, retry, o.refund_attempt, o.error, o.traceback]


def _outcome(fields: list[object]) -> Outcome:
    kind, label, retry, refund, error, trace = fields
    return Outcome(
        SettleKind(str(kind)),
        str(label),
        None if retry is None else timedelta(seconds=float(str(retry))),
        bool(refund),
        None if error is None else str(error),
        None if trace is None else str(trace),
    )


def encode(message: Message) -> bytes:
    """The frame of ``message``."""
    match message:
        case Booted():
            body: list[object] = ["B"]
        case Assign(seq, c):
            body = [
                "A",
                seq,
                c.id,
                c.ticket.holder,
                c.ticket.attempt,
                c.expirations,
                c.topic,
                c.locked_until.isoformat(),
                c.payload_text,
            ]
        case Stop():
            body = ["S"]
        case Finished(seq, t, o, duration, written, leaving):
            body = [
                "F",
                seq,
                t.job_id,
                t.holder,
                t.attempt,
                *_outcome_fields(o),
                duration,
                written,
                leaving,
            ]
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )
    return _LENGTH.pack(len(data)) + data


def decode(data: bytes) -> Message:
    """The message of one frame's body; ProtocolError for anything else."""
    try:
        body = json.loads(data.decode("utf-8", "surrogatepass"))
        match body:
            case ["B"]:
                return Booted()
            case ["A", seq, job_id, holder, attempt, expirations, topic, until, payload]:
                ticket = Ticket(str(job_id), str(holder), int(attempt))
                return Assign(
                    int(seq),
                    Claimed(
                        ticket,
                        str(topic),
                        str(payload),
                        datetime.fromisoformat(str(until)),
                        int(expirations),
                    ),
                )
            case ["S"]:
                return Stop()
            case ["F", seq, job_id, holder, attempt, *rest] if len(rest) == 9:
                ticket = Ticket(str(job_id), str(holder), int(attempt))
                written = rest[7] if rest[7] is None else bool(rest[7])
                leaving = rest[8] if rest[8] is None else str(rest[8])
                outcome = _outcome(rest[:6])
                return Finished(int(seq), ticket, outcome, float(rest[6]), written, leaving)
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"undecodable message: {type(exc).__name__}") from None
    raise ProtocolError("unknown message")


READ_SIZE = 1 << 16
"""Bytes asked of one read: below malloc's mmap threshold, so a read costs no mmap/munmap."""


class FrameReader:
    """Splits the bytes read from a socket into messages (non-blocking reads)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def read(self) -> tuple[list[Message], bool]:
        """Messages available now, and whether the peer closed its end (EOF)."""
        try:
            chunk = os.read(self.fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return [], False
        except OSError:
            return [], True
        if not chunk:
            return self._split(), True
        self._buffer += chunk
        return self._split(), False

    def _split(self) -> list[Message]:
        out: list[Message] = []
        buf, pos, size = self._buffer, 0, len(self._buffer)
        while size - pos >= 4:
            (length,) = _LENGTH.unpack_from(buf, pos)
            if length > MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes")
            end = pos + 4 + length
            if end > size:
                break
            out.append(decode(bytes(buf[pos + 4 : end])))
            pos = end
        if pos:
            del buf[:pos]  # once per read: many frames in one chunk cost one move
        return out


def write_message(fd: int, message: Message) -> None:
    """Write ``message`` whole on ``fd``, waiting while the peer's buffer is full; OSError
    when the peer is gone."""
    data = memoryview(encode(message))
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            select.select([], [fd], [])
