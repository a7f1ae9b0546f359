"""Logging: one line per event with a stable event name, key=value or JSON."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

from brooq.engine.runner import Attempted
from brooq.engine.store import Claimed
from brooq.vocabulary import KindOptions

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED}


_NEEDS_QUOTES = re.compile(r'[ "=\n\t]')


def _kv_value(value: Any) -> str:
    text = str(value)
    if text == "" or _NEEDS_QUOTES.search(text):
        return json.dumps(text, ensure_ascii=False)
    return text


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=info event=JobDone job_id=… topic=…`` — greppable, one line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record and its extra fields as key=value pairs."""
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"ts={ts}.{int(record.msecs):03d}Z", f"level={record.levelname.lower()}",
                 f"logger={record.name}", f"msg={_kv_value(record.getMessage())}"]
        parts += [f"{k}={_kv_value(v)}" for k, v in _fields(record).items()]
        if record.exc_info:
            parts.append(f"exc={_kv_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the extra fields as keys."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one JSON line."""
        out: dict[str, Any] = {
            "ts": record.created, "level": record.levelname.lower(), "logger": record.name,
            "msg": record.getMessage(), **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


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
    """Logs JobClaimed and the outcome event of every attempt."""

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        """Log JobClaimed."""
        event(job_log, "JobClaimed", job_id=claimed.id, topic=claimed.topic,
              attempt=claimed.attempt)

    def settled(self, attempted: Attempted) -> None:
        """Log JobDone/JobFailed/JobDead/JobCanceled (or LeaseLost when nothing was written)."""
        outcome = attempted.outcome
        name = EVENT_BY_LABEL.get(outcome.label, "JobFailed")
        fields = {
            "job_id": attempted.claimed.id, "topic": attempted.claimed.topic,
            "attempt": attempted.claimed.attempt, "outcome": outcome.label,
            "duration_s": round(attempted.duration_s, 6),
        }
        if outcome.retry_in is not None:
            fields["retry_in_s"] = round(outcome.retry_in.total_seconds(), 3)
        if outcome.error and outcome.label != "done":
            fields["error"] = outcome.error
        if attempted.written is False and outcome.label != "abandoned":
            name, fields["note"] = "LeaseLost", "outcome not written: the lease was lost"
        level = logging.WARNING if name in ("JobDead", "LeaseLost") else logging.INFO
        event(job_log, name, level, **fields)
