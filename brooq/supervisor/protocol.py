"""Parent ↔ worker messages over a socket pair: length-prefixed JSON frames.

Parent → worker: ``Assign`` (a claimed job for the worker's queue, with its
sequence number), ``Stop`` (start nothing more, leave). Worker → parent:
``Booted``, ``Finished`` (the decided outcome, or a settle the worker wrote
itself because the job had effects). A job the worker never started is
known to the parent from the worker's board (board.py), so a worker that
leaves or dies says nothing of its queue. A frame is a 4-byte big-endian
length and a body whose first byte names the message: a struct of fixed fields,
then the texts, each with its length (JSON cost several times as much per job,
both ways). Anything that does not decode is a protocol error: the parent
treats that worker as broken.
"""

from __future__ import annotations

import math
import os
import select
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.store import Claimed, Ticket
from brooq.vocabulary import JOB_OVERRIDES, KindOptions
from brooq.vocabulary.options import stored_overrides

MAX_FRAME = 64 * 1024 * 1024
"""The largest message between parent and worker; a payload must fit in it with room to spare
(QUEUE_MAX_PAYLOAD_BYTES is bounded below it)."""
MAX_PAYLOAD_BYTES = MAX_FRAME - 1024 * 1024
_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a message: it is broken or not a brooq process."""


class FrameTooLarge(ValueError):
    """A message larger than MAX_FRAME: it cannot be sent to a worker."""


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


# Frames are binary: a struct head of fixed fields, then the texts, each with its length.
_ASSIGN = struct.Struct(">cQiidHHHBH")
"""A, seq, attempt, expirations, locked_until (POSIX seconds), len(id), len(holder), len(topic),
whether overrides follow, len(trace context) (the NONE length: None); then the overrides
(_OVERRIDES) when they do, the id, the holder, the topic, the trace context and, to the end of
the frame, the payload."""
_OVERRIDES = struct.Struct(">idddd")
"""A job's own max_attempts (0: none) and its four durations in seconds (NaN: none)."""
_DURATIONS = JOB_OVERRIDES[1:]
_FINISHED = struct.Struct(">cQidbBBdHHHHIII")
"""F, seq, attempt, duration, written (-1 None), kind, refund, retry_in (NaN: none), len(id),
len(holder), len(label), len(leaving), len(error), len(traceback), len(result) (the NONE
lengths: None)."""
_KINDS = list(SettleKind)
_NONE16 = 0xFFFF
_NONE32 = 0xFFFFFFFF
_TEXT = ("utf-8", "surrogatepass")


def _bytes(text: str | None, none: int) -> tuple[bytes, int]:
    if text is None:
        return b"", none
    data = text.encode(*_TEXT)
    return data, len(data)


def _encode_assign(seq: int, c: Claimed) -> bytes:
    texts = [c.id.encode(), c.ticket.holder.encode(*_TEXT), c.topic.encode(*_TEXT)]
    trace, trace_length = _bytes(c.trace_context, _NONE16)
    head = _ASSIGN.pack(
        b"A",
        seq,
        c.ticket.attempt,
        c.expirations,
        c.locked_until.timestamp(),
        *(len(t) for t in texts),
        c.overrides is not None,
        trace_length,
    )
    overrides = b"" if c.overrides is None else _encode_overrides(c.overrides)
    return b"".join([head, overrides, *texts, trace, c.payload_text.encode(*_TEXT)])


def _encode_overrides(o: KindOptions) -> bytes:
    durations = (getattr(o, name) for name in _DURATIONS)
    return _OVERRIDES.pack(
        o.max_attempts or 0, *(math.nan if d is None else d.total_seconds() for d in durations)
    )


def _decode_overrides(data: bytes, at: int) -> KindOptions:
    max_attempts, *seconds = _OVERRIDES.unpack_from(data, at)
    return stored_overrides(
        [max_attempts or None, *(None if math.isnan(s) else timedelta(seconds=s) for s in seconds)]
    )  # type: ignore[return-value]  # a frame carries overrides only when one is set


def _encode_finished(msg: Finished) -> bytes:
    o, t = msg.outcome, msg.ticket
    parts = [
        _bytes(t.job_id, _NONE16),
        _bytes(t.holder, _NONE16),
        _bytes(o.label, _NONE16),
        _bytes(msg.leaving, _NONE16),
        _bytes(o.error, _NONE32),
        _bytes(o.traceback, _NONE32),
        _bytes(o.result, _NONE32),
    ]
    head = _FINISHED.pack(
        b"F",
        msg.seq,
        t.attempt,
        msg.duration_s,
        -1 if msg.written is None else int(msg.written),
        _KINDS.index(o.kind),
        int(o.refund_attempt),
        math.nan if o.retry_in is None else o.retry_in.total_seconds(),
        *(n for _, n in parts),
    )
    return b"".join([head, *(data for data, _ in parts)])


def encode(message: Message) -> bytes:
    """The frame of ``message``."""
    match message:
        case Booted():
            body = b"B"
        case Stop():
            body = b"S"
        case Assign(seq, claimed):
            body = _encode_assign(seq, claimed)
        case Finished():
            body = _encode_finished(message)
    if len(body) > MAX_FRAME:
        raise FrameTooLarge(f"a message of {len(body)} bytes > {MAX_FRAME} bytes")
    return _LENGTH.pack(len(body)) + body


class _Texts:
    """Reads the texts that follow a frame's head, each by its length."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def next(self, length: int, none: int = -1) -> str | None:
        if length == none:
            return None
        end = self.at + length
        if end > len(self.data):
            raise ValueError("a text runs past the end of the frame")
        text = self.data[self.at : end].decode(*_TEXT)
        self.at = end
        return text

    def rest(self) -> str:
        return self.data[self.at :].decode(*_TEXT)


def _decode_assign(data: bytes) -> Assign:
    _, seq, attempt, expirations, until, *lengths, has_overrides, trace = _ASSIGN.unpack_from(data)
    at = _ASSIGN.size
    overrides = None
    if has_overrides:
        overrides = _decode_overrides(data, at)
        at += _OVERRIDES.size
    texts = _Texts(data, at)
    job_id, holder, topic = (str(texts.next(n)) for n in lengths)
    trace_context = texts.next(trace, _NONE16)
    claimed = Claimed(
        Ticket(job_id, holder, attempt),
        topic,
        texts.rest(),
        datetime.fromtimestamp(until, UTC),
        expirations,
        overrides=overrides,
        trace_context=trace_context,
    )
    return Assign(seq, claimed)


def _decode_finished(data: bytes) -> Finished:
    _, seq, attempt, duration, written, kind, refund, retry, *lengths = _FINISHED.unpack_from(data)
    texts = _Texts(data, _FINISHED.size)
    job_id, holder, label, leaving = (texts.next(n, _NONE16) for n in lengths[:4])
    error, trace, result = (texts.next(n, _NONE32) for n in lengths[4:])
    if job_id is None or holder is None or label is None or texts.at != len(data):
        raise ValueError("a Finished frame with missing or extra fields")
    outcome = Outcome(
        _KINDS[kind],
        label,
        None if math.isnan(retry) else timedelta(seconds=retry),
        bool(refund),
        error,
        trace,
        result,
    )
    done = None if written == -1 else bool(written)
    return Finished(seq, Ticket(job_id, holder, attempt), outcome, duration, done, leaving)


def decode(data: bytes) -> Message:
    """The message of one frame's body; ProtocolError for anything else."""
    try:
        match data[:1]:
            case b"B" if len(data) == 1:
                return Booted()
            case b"S" if len(data) == 1:
                return Stop()
            case b"A":
                return _decode_assign(data)
            case b"F":
                return _decode_finished(data)
    except (struct.error, ValueError, IndexError, UnicodeDecodeError, OverflowError) as exc:
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
