"""Logging: one line per event with a stable event name, key=value or JSON."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED}


def _kv_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log event ``name`` (JobClaimed, JobDone, …) with ``fields`` as structured extras."""
    logger.log(level, name, extra={"event": name, **fields})
