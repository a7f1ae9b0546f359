"""Every log line is one bounded, escaped, password-free line, whatever a handler raised."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from brooq import logs
from brooq.logs import EXC_MAX_CHARS, FIELD_MAX_CHARS, JsonFormatter, KeyValueFormatter
from brooq.vocabulary import secrets as secrets_of_process

SECRET = "Wr-Zq9-s3cret-pw"
FORMATTERS = [JsonFormatter(), KeyValueFormatter()]
FORMATTER_IDS = ["json", "kv"]


@pytest.fixture(autouse=True)
def secrets() -> Iterator[None]:
    """The DSN password known to the logs, as `brooq` sets it from DATABASE_URL."""
    saved = secrets_of_process.known_secrets()
    logs.hide_secrets([SECRET])
    yield
    secrets_of_process.forget_secrets()
    secrets_of_process.hide_everywhere(saved)


def record(
    msg: str = "handler failed", exc: BaseException | None = None, **fields: object
) -> logging.LogRecord:
    """A log record as brooq's code makes one: a message, extra fields, maybe an exception."""
    info = None
    if exc is not None:
        try:
            raise exc
        except BaseException:
            info = sys.exc_info()
    rec = logging.LogRecord("brooq.test", logging.WARNING, __file__, 1, msg, None, info)
    rec.__dict__.update(fields)
    return rec


@pytest.mark.parametrize("formatter", FORMATTERS, ids=FORMATTER_IDS)
def test_a_10_mb_message_makes_a_bounded_line(formatter: logging.Formatter) -> None:
    huge = "x" * 10_000_000
    line = formatter.format(record(huge, RuntimeError(huge), error=huge))
    assert len(line) <= 2 * FIELD_MAX_CHARS + EXC_MAX_CHARS + 1000
    assert "…" in line


@pytest.mark.parametrize("formatter", FORMATTERS, ids=FORMATTER_IDS)
def test_separators_and_control_characters_never_reach_the_line_raw(
    formatter: logging.Formatter,
) -> None:
    text = "a\nb\rc\u2028d\u2029e\u0085f\x1b[2Jg\x00h"
    line = formatter.format(record(text, ValueError(text), error=text))
    assert line.splitlines() == [line]
    for raw in ("\n", "\r", "\u2028", "\u2029", "\u0085", "\x1b", "\x00"):
        assert raw not in line, repr(raw)
    if isinstance(formatter, JsonFormatter):
        assert json.loads(line)["error"] == text.replace("\x00", "\\0")


@pytest.mark.parametrize("formatter", FORMATTERS, ids=FORMATTER_IDS)
def test_lone_surrogates_are_escaped_not_fatal(formatter: logging.Formatter) -> None:
    line = formatter.format(record("bad \udcff", ValueError("bad \udcff"), key="k\udcff"))
    line.encode("utf-8")  # would raise on a lone surrogate
    assert "\\udcff" in line


@pytest.mark.parametrize("formatter", FORMATTERS, ids=FORMATTER_IDS)
def test_passwords_are_hidden_in_messages_fields_and_tracebacks(
    formatter: logging.Formatter,
) -> None:
    dsn = f"postgresql://app:{SECRET}@db.internal:5432/app"
    line = formatter.format(
        record(
            f"cannot connect to {dsn}",
            RuntimeError(f"password={SECRET} rejected"),
            error=f'invalid percent-encoded token: "{SECRET}"',
            other="postgresql://u:another-one@h/db",
            kv="host=h password='p w' dbname=d",
        )
    )
    assert SECRET not in line and "another-one" not in line and "p w" not in line
    assert "***" in line


def test_ordinary_fields_are_left_alone() -> None:
    line = KeyValueFormatter().format(
        record("JobDone", job_id="01a2-…", topic="email.send", attempt=2)
    )
    assert "msg=JobDone" in line and "topic=email.send" in line and "attempt=2" in line


def test_done_jobs_are_logged_only_when_every_job_is(caplog: pytest.LogCaptureFixture) -> None:
    """QUEUE_LOG_JOBS off: a done job writes no INFO line; a failure is logged either way."""
    from datetime import UTC, datetime, timedelta

    from brooq.engine.outcome import DONE, Outcome, SettleKind
    from brooq.engine.runner import Attempted
    from brooq.engine.store import Claimed, Ticket
    from brooq.logs import LoggingListener
    from brooq.vocabulary import KindOptions

    claimed = Claimed(Ticket("j1", "h", 1), "t", "{}", datetime.now(UTC))
    failed = Outcome(SettleKind.FAILED, "failed", timedelta(seconds=1), error="E: x")
    caplog.set_level(logging.INFO)
    quiet = LoggingListener(every_job=False)
    quiet.claimed(claimed, KindOptions())
    quiet.settled(Attempted(claimed, DONE, None, 0.01))
    assert [r.getMessage() for r in caplog.records] == []
    quiet.settled(Attempted(claimed, failed, None, 0.01))
    assert [r.getMessage() for r in caplog.records] == ["JobFailed"]
    caplog.clear()
    loud = LoggingListener(every_job=True)
    loud.claimed(claimed, KindOptions())
    loud.settled(Attempted(claimed, DONE, None, 0.01))
    assert [r.getMessage() for r in caplog.records] == ["JobClaimed", "JobDone"]


def test_a_stalled_sink_never_blocks_a_log_call_lines_are_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 22, item 3: stderr on a pipe nobody reads blocked the supervisor's loop.
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    read_end, write_end = os.pipe()
    sink = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stderr", sink)
    logger = logging.getLogger("brooq.test.stalled")
    try:
        logs.setup_logging("kv", "info")
        finished = threading.Event()

        def log_many() -> None:
            for n in range(20_000):  # 6 MB of lines: well past the pipe's and the buffer's room
                logs.event(logger, "Filler", n=n, pad="x" * 300)
            finished.set()

        threading.Thread(target=log_many, daemon=True).start()
        assert finished.wait(10), "a log call blocked on the stalled sink"
        handler = root.handlers[0]
        assert isinstance(handler, logs.LineBuffer) and handler.dropped > 0
        text = _read_until(read_end, "event=LogLinesDropped", timeout=10)
        assert "event=Filler n=0 " in text  # what was held is written once the sink takes it
        assert f"dropped_total={handler.dropped}" in text
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved
        os.set_blocking(read_end, False)
        with contextlib.suppress(OSError):
            while os.read(read_end, 1 << 16):
                pass
        sink.close()
        os.close(read_end)


def _read_until(fd: int, marker: str, timeout: float) -> str:
    """What ``fd`` yields until a line holding ``marker`` is whole (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            data += os.read(fd, 1 << 16)
        text = data.decode("utf-8", "replace")
        at = text.find(marker)
        if at >= 0 and "\n" in text[at:]:
            return text
    raise AssertionError(f"{marker} not read within {timeout}s")
