"""Parent ↔ worker frames: every message comes back as it went, and garbage is a ProtocolError."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.store import Claimed, Ticket
from brooq.supervisor import protocol
from brooq.vocabulary import KindOptions
from brooq.vocabulary.options import stored_overrides

TEXT = st.text(max_size=200)
IDS = st.uuids().map(str)


DURATIONS = st.none() | st.integers(1, 365 * 86400 * 10**6).map(
    lambda us: timedelta(microseconds=us)
)


@st.composite
def overrides(draw: st.DrawFn) -> KindOptions | None:
    """A job's own options as a claim carries them: any of them set, or none."""
    values = [draw(st.none() | st.integers(1, 1_000_000))] + [draw(DURATIONS) for _ in range(4)]
    return stored_overrides(values)


@st.composite
def claims(draw: st.DrawFn) -> Claimed:
    until = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=draw(st.integers(0, 10**12)))
    return Claimed(
        Ticket(draw(IDS), draw(TEXT), draw(st.integers(1, 2**31 - 1))),
        draw(TEXT),
        draw(st.text(max_size=2000)),
        until,
        draw(st.integers(0, 2**31 - 1)),
        overrides=draw(overrides()),
        trace_context=draw(st.none() | TEXT),
    )


@st.composite
def outcomes(draw: st.DrawFn) -> Outcome:
    retry = draw(st.none() | st.floats(0, 1e6, allow_nan=False))
    return Outcome(
        draw(st.sampled_from(list(SettleKind))),
        draw(TEXT),
        None if retry is None else timedelta(seconds=retry),
        draw(st.booleans()),
        draw(st.none() | TEXT),
        draw(st.none() | st.text(max_size=5000)),
    )


def roundtrip(message: protocol.Message) -> protocol.Message:
    frame = protocol.encode(message)
    r, w = os.pipe()
    try:
        os.write(w, frame)
        os.close(w)
        reader = protocol.FrameReader(r)
        messages, _ = reader.read()
    finally:
        os.close(r)
    assert len(messages) == 1
    return messages[0]


@given(st.integers(0, 2**63 - 1), claims())
def test_an_assign_comes_back_as_sent(seq: int, claimed: Claimed) -> None:
    got = roundtrip(protocol.Assign(seq, claimed))
    assert isinstance(got, protocol.Assign) and got.seq == seq
    c = got.claimed
    assert (c.ticket, c.topic, c.payload_text, c.expirations) == (
        claimed.ticket,
        claimed.topic,
        claimed.payload_text,
        claimed.expirations,
    )
    assert abs((c.locked_until - claimed.locked_until).total_seconds()) < 1e-5


@given(
    st.integers(0, 2**63 - 1),
    IDS,
    TEXT,
    outcomes(),
    st.floats(0, 1e6, allow_nan=False),
    st.none() | st.booleans(),
    st.none() | TEXT,
)
def test_a_finished_comes_back_as_sent(
    seq: int,
    job_id: str,
    holder: str,
    outcome: Outcome,
    duration: float,
    written: bool | None,
    leaving: str | None,
) -> None:
    sent = protocol.Finished(seq, Ticket(job_id, holder, 3), outcome, duration, written, leaving)
    got = roundtrip(sent)
    assert isinstance(got, protocol.Finished)
    assert (got.seq, got.ticket, got.duration_s, got.written, got.leaving) == (
        seq,
        sent.ticket,
        duration,
        written,
        leaving,
    )
    o = got.outcome
    assert (o.kind, o.label, o.refund_attempt, o.error, o.traceback) == (
        outcome.kind,
        outcome.label,
        outcome.refund_attempt,
        outcome.error,
        outcome.traceback,
    )
    if outcome.retry_in is None:
        assert o.retry_in is None
    else:
        assert o.retry_in is not None
        assert abs((o.retry_in - outcome.retry_in).total_seconds()) < 1e-5


def test_a_lone_surrogate_in_an_error_survives() -> None:
    outcome = Outcome(SettleKind.FAILED, "failed", error="bad \udcff byte")
    sent = protocol.Finished(1, Ticket("j", "h", 1), outcome, 0.1)
    got = roundtrip(sent)
    assert isinstance(got, protocol.Finished) and got.outcome.error == "bad \udcff byte"


@given(st.binary(max_size=300))
def test_garbage_is_a_protocol_error_never_a_crash(body: bytes) -> None:
    with contextlib.suppress(protocol.ProtocolError):
        protocol.decode(body)


def test_a_truncated_or_padded_finished_is_refused() -> None:
    frame = protocol.encode(
        protocol.Finished(1, Ticket("j", "h", 1), Outcome(SettleKind.DONE, "done"), 0.1)
    )
    body = frame[4:]
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(body[:-1])
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(body + b"x")
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b"Z")


def test_many_frames_in_one_read_split_in_order() -> None:
    frames = b"".join(protocol.encode(protocol.Booted()) for _ in range(3))
    frames += protocol.encode(protocol.Stop())[:3]  # half a frame: kept for the next read
    r, w = os.pipe()
    try:
        os.write(w, frames)
        reader = protocol.FrameReader(r)
        messages, eof = reader.read()
        assert messages == [protocol.Booted()] * 3 and not eof
        os.write(w, protocol.encode(protocol.Stop())[3:])
        assert reader.read() == ([protocol.Stop()], False)
    finally:
        os.close(r)
        os.close(w)
