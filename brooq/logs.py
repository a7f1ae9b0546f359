"""Logging: one line per event with a stable event name, key=value or JSON.

Every line is safe whatever a handler raised: each text is bounded (a 10 MB
exception message makes a bounded line), lone surrogates are escaped, line
and paragraph separators (U+2028, U+2029, U+0085) are escaped like newlines,
and DSN passwords are hidden (any URL or ``password=`` pair, and the
passwords given to :func:`hide_secrets`). Writing never blocks the caller: a
:class:`LineBuffer` drops (and counts) lines when the sink stalls.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import sys
import threading
import time
from collections import deque
from datetime import timedelta
from typing import Any, TextIO

from brooq.engine.outcome import bounded, safe_text
from brooq.engine.runner import Attempted
from brooq.engine.store import Claimed
from brooq.vocabulary import KindOptions, format_duration
from brooq.vocabulary.secrets import hide_everywhere, known_secrets, scrub

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
FIELD_MAX_CHARS = 4000
"""The longest text of one field or message in a log line (last_error is 2,000)."""
EXC_MAX_CHARS = 16_000
"""The longest traceback in a log line (its end is kept: the innermost frames)."""
# JSON leaves these raw with ensure_ascii=False, yet many readers break lines at them.
_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"}


def hide_secrets(secrets: list[str]) -> None:
    """Hide each of ``secrets`` (the DSN's password, the token) in every log line, and in
    every error text brooq stores (see brooq.vocabulary.secrets.scrub)."""
    hide_everywhere(secrets)


def clean_text(text: str, limit: int = FIELD_MAX_CHARS) -> str:
    """``text`` bounded, with lone surrogates escaped and passwords hidden."""
    text = safe_text(bounded(text, limit))
    # The patterns only where they can match: most fields are ids and names (hot path).
    if "://" in text or "password" in text.lower() or any(s in text for s in known_secrets()):
        text = scrub(text)
    return text


def clean(value: Any) -> Any:
    """``value``, cleaned by :func:`clean_text` when it is a text."""
    return clean_text(value) if isinstance(value, str) else value


def _exc_text(text: str) -> str:
    if len(text) > EXC_MAX_CHARS:
        text = "…" + text[-(EXC_MAX_CHARS - 1) :]
    return clean_text(text, EXC_MAX_CHARS)


def _one_line(text: str) -> str:
    for raw, escaped in _SEPARATORS.items():
        if raw in text:
            text = text.replace(raw, escaped)
    return text


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: clean(v) for k, v in vars(record).items() if k not in _RESERVED}


_NEEDS_QUOTES = re.compile(r'[ "=]')
"""Besides these, any character that is not printable (newlines, separators, escapes)."""


def _kv_value(value: Any) -> str:
    text = clean_text(str(value))
    if text == "" or _NEEDS_QUOTES.search(text) or not text.isprintable():
        return _one_line(json.dumps(text, ensure_ascii=False))
    return text


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=info event=JobDone job_id=… topic=…`` — greppable, one line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record and its extra fields as key=value pairs."""
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_kv_value(record.getMessage())}",
        ]
        parts += [f"{k}={_kv_value(v)}" for k, v in _fields(record).items()]
        if record.exc_info:
            exc = _exc_text(self.formatException(record.exc_info))
            parts.append(f"exc={_one_line(json.dumps(exc, ensure_ascii=False))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the extra fields as keys."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one JSON line."""
        out: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": clean(record.getMessage()),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = _exc_text(self.formatException(record.exc_info))
        return _one_line(json.dumps(out, default=lambda v: clean_text(str(v)), ensure_ascii=False))


BUFFER_BYTES = 4 * 1024 * 1024
"""Log text a process holds for a sink that does not take it (say stderr on a pipe nobody
reads) before it drops lines; the dropped lines are counted and the count logged."""
FLUSH_S = 2.0
"""At exit, how long the lines still held may take to reach the sink."""


class LineBuffer(logging.Handler):
    """Formats each record in the caller's thread and hands the line to a writer thread, so
    that a sink that stalls never blocks the caller (the supervisor's loop above all).

    At most ``max_bytes`` of lines wait; past that, lines are dropped and
    counted, and once the sink takes lines again an event ``LogLinesDropped``
    says how many were lost. The writer uses the stream's file descriptor,
    never the stream object, so a forked child never inherits the stream's
    lock held by the writer. The writer thread is the parent's alone: in a
    forked child (a worker, which leaves through ``os._exit`` with nothing
    flushed) a line is written at once when the sink can take it now, and
    dropped and counted the same way when it cannot. A stream without a
    descriptor (a test's capture) is written directly.
    """

    def __init__(self, stream: TextIO, max_bytes: int = BUFFER_BYTES) -> None:
        super().__init__()
        self.stream, self.max_bytes = stream, max_bytes
        self.fd = _fileno(stream)
        self.dropped = 0
        """Lines dropped since this handler was made."""
        self._unreported = 0
        self._lines: deque[bytes] = deque()
        self._held = 0
        self._writing = False
        self._closed = False
        self._cond = threading.Condition(threading.Lock())
        self._owner = self._child = os.getpid()
        self._writer: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Queue the record's line (or drop and count it when the buffer is full)."""
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except Exception:
            self.handleError(record)
            return
        if self.fd is None or self._closed:
            self._write_now(line)
            return
        if os.getpid() != self._owner:
            self._write_if_ready(line)
            return
        with self._cond:
            if self._held + len(line) > self.max_bytes:
                self.dropped += 1
                self._unreported += 1
                return
            self._lines.append(line)
            self._held += len(line)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_lines, name="brooq-log-writer", daemon=True
                )
                self._writer.start()
            self._cond.notify()

    def _write_now(self, line: bytes) -> None:
        try:
            if self.fd is None:
                self.stream.write(line.decode("utf-8"))
                self.stream.flush()
            else:
                _write_all(self.fd, line)
        except (OSError, ValueError):
            pass  # the sink is gone (a closed pipe): nothing else to tell it

    def _write_if_ready(self, line: bytes) -> None:
        """In a forked child: write ``line`` if the sink takes it now, else drop and count it."""
        if self._child != os.getpid():  # counts inherited from the parent are not ours
            self._child, self.dropped, self._unreported = os.getpid(), 0, 0
        assert self.fd is not None
        try:
            _, ready, _ = select.select([], [self.fd], [], 0)
            if ready and self._unreported:
                _write_all(self.fd, self._dropped_line(self._unreported))
                self._unreported = 0
            if ready:
                _write_all(self.fd, line)
                return
        except (OSError, ValueError):
            pass
        self.dropped += 1
        self._unreported += 1

    def _write_lines(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._lines or self._closed)
                if not self._lines:
                    return
                batch = b"".join(self._lines)
                count = len(self._lines)
                self._lines.clear()
                self._held, self._writing = 0, True
            written = self._write_batch(batch)
            with self._cond:
                unreported = 0
                if written:
                    unreported, self._unreported = self._unreported, 0
                else:
                    self.dropped += count
                    self._unreported += count
            if unreported:
                self._write_batch(self._dropped_line(unreported))
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _write_batch(self, data: bytes) -> bool:
        assert self.fd is not None
        try:
            _write_all(self.fd, data)
        except OSError:
            return False
        return True

    def _dropped_line(self, count: int) -> bytes:
        record = logging.makeLogRecord(
            {
                "name": "brooq.logs",
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": "LogLinesDropped",
                "event": "LogLinesDropped",
                "dropped": count,
                "dropped_total": self.dropped,
                "note": "the log's sink did not take lines in time; these were not written",
            }
        )
        return (self.format(record) + "\n").encode("utf-8", "backslashreplace")

    def flush(self) -> None:
        """Wait (at most FLUSH_S) until every held line has been written."""
        if self._writer is None or os.getpid() != self._owner:
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._lines and not self._writing, FLUSH_S)

    def close(self) -> None:
        """Write what is held (bounded by FLUSH_S), then stop the writer."""
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().close()


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # io.UnsupportedOperation is an OSError and a ValueError


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, waiting when it is non-blocking and full."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)


def setup_logging(fmt: str = "kv", level: str = "info") -> None:
    """Send brooq's logs to stderr in ``fmt`` (kv or json) at ``level``, through a LineBuffer."""
    # Two lines per job: spare each record what no brooq formatter prints (the
    # logging HOWTO's "Optimization"): the caller's frame, thread and process names.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = LineBuffer(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in root.handlers:
        old.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log event ``name`` (JobClaimed, JobDone, …) with ``fields`` as structured extras."""
    logger.log(level, name, extra={"event": name, **fields})


job_log = logging.getLogger("brooq.worker")

EVENT_BY_LABEL = {
    "done": "JobDone",
    "failed": "JobFailed",
    "delayed": "JobFailed",
    "preserved": "JobFailed",
    "dead": "JobDead",
    "canceled": "JobCanceled",
    "abandoned": "LeaseLost",
}


class LoggingListener:
    """Logs JobClaimed and the outcome event of every attempt.

    With ``every_job`` off (the supervisor's default, QUEUE_LOG_JOBS), a job
    that is claimed and done is logged at DEBUG only: its row is its record
    and the metrics count it, and two log lines cost more CPU than a short
    job itself. Failures, dead and canceled jobs and lost leases are logged
    either way.
    """

    def __init__(self, every_job: bool = True) -> None:
        self.every_job = every_job

    def _quiet(self) -> bool:
        return not self.every_job and not job_log.isEnabledFor(logging.DEBUG)

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        """Log JobClaimed (at DEBUG unless every job is logged)."""
        if self._quiet():
            return
        level = logging.INFO if self.every_job else logging.DEBUG
        event(
            job_log,
            "JobClaimed",
            level,
            job_id=claimed.id,
            topic=claimed.topic,
            attempt=claimed.attempt,
        )

    def settled(self, attempted: Attempted) -> None:
        """Log JobDone/JobFailed/JobDead/JobCanceled (or LeaseLost when nothing was written)."""
        outcome = attempted.outcome
        quiet_done = outcome.label == "done" and attempted.written is not False
        if quiet_done and self._quiet():
            return
        name = EVENT_BY_LABEL.get(outcome.label, "JobFailed")
        fields = {
            "job_id": attempted.claimed.id,
            "topic": attempted.claimed.topic,
            "attempt": attempted.claimed.attempt,
            "outcome": outcome.label,
            "duration_s": round(attempted.duration_s, 6),
        }
        if outcome.retry_in is not None:
            fields["retry_in_s"] = round(outcome.retry_in.total_seconds(), 3)
        if outcome.error and outcome.label != "done":
            fields["error"] = outcome.error
        if attempted.written is False and outcome.label != "abandoned":
            name, fields["note"] = "LeaseLost", "outcome not written: the lease was lost"
        level = logging.WARNING if name in ("JobDead", "LeaseLost") else logging.INFO
        if quiet_done and not self.every_job:
            level = logging.DEBUG
        event(job_log, name, level, **fields)


def listen_off(poll_interval: timedelta) -> None:
    """Say once, at start, that nothing LISTENs and what that costs."""
    event(
        logging.getLogger("brooq.listen"),
        "ListenOff",
        logging.WARNING,
        poll_interval=format_duration(poll_interval),
        note="QUEUE_PGBOUNCER without QUEUE_LISTEN_URL: no LISTEN through a transaction "
        "pooler; new jobs are looked for every poll interval, cancels of running "
        "jobs are learned at the next heartbeat (lease/3)",
    )
