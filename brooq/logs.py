"""Logging: one line per event with a stable event name, key=value or JSON.

Every line is safe whatever a handler raised: each text is bounded (a 10 MB
exception message makes a bounded line), lone surrogates are escaped, line
and paragraph separators (U+2028, U+2029, U+0085) are escaped like newlines,
and DSN passwords are hidden (any URL or ``password=`` pair, and the
passwords given to :func:`hide_secrets`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from datetime import timedelta
from typing import Any

from brooq.engine.outcome import bounded, safe_text
from brooq.engine.runner import Attempted
from brooq.engine.store import Claimed
from brooq.vocabulary import KindOptions, format_duration
from brooq.vocabulary.secrets import REDACTED, scrub

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
FIELD_MAX_CHARS = 4000
"""The longest text of one field or message in a log line (last_error is 2,000)."""
EXC_MAX_CHARS = 16_000
"""The longest traceback in a log line (its end is kept: the innermost frames)."""
# JSON leaves these raw with ensure_ascii=False, yet many readers break lines at them.
_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"}
_secrets: list[str] = []
BARE_SECRET_MIN = 8
"""The shortest secret hidden wherever it appears in a log line (not only in a DSN)."""


def hide_secrets(secrets: list[str]) -> None:
    """Hide each of ``secrets`` (say the DSN's password) wherever it shows up in a log line."""
    # Longest first: a secret inside another is replaced after it. Only secrets of
    # BARE_SECRET_MIN characters or more are hidden wherever they appear: a short
    # password ("brooq") is also a word, a path, a user name, and hiding it would
    # garble every line. In a DSN or `password=` scrub() hides any password.
    _secrets[:] = sorted(
        {s for s in _secrets + secrets if len(s) >= BARE_SECRET_MIN}, key=len, reverse=True
    )


def clean_text(text: str, limit: int = FIELD_MAX_CHARS) -> str:
    """``text`` bounded, with lone surrogates escaped and passwords hidden."""
    text = safe_text(bounded(text, limit))
    # The patterns only where they can match: most fields are ids and names (hot path).
    if "://" in text or "password" in text.lower():
        text = scrub(text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
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


def setup_logging(fmt: str = "kv", level: str = "info") -> None:
    """Send brooq's logs to stderr in ``fmt`` (kv or json) at ``level``."""
    # Two lines per job: spare each record what no brooq formatter prints (the
    # logging HOWTO's "Optimization"): the caller's frame, thread and process names.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
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
