"""A handler's result: its return value, kept as JSON in the job's row, and the errors of
waiting for it (``queue.result``)."""

from __future__ import annotations

import json
from typing import Any

from brooq.vocabulary.errors import BrooqError
from brooq.vocabulary.state import State

DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
MAX_RESULT_BYTES_LIMIT = 16 * 1024 * 1024
"""The largest QUEUE_MAX_RESULT_BYTES: like a payload, a result crosses the 64 MiB frame
from its worker to the supervisor, escaping and all."""

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class ResultNotJSON(Exception):
    """A handler returned a value that is not JSON (or that PostgreSQL's jsonb cannot hold):
    the attempt failed, as if the handler had raised."""


class ResultTooLarge(Exception):
    """A handler returned a value larger than QUEUE_MAX_RESULT_BYTES: the attempt failed."""


def encode_result(value: Any, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> str | None:
    """The JSON text of a handler's return value (None for None: nothing is stored).

    ResultNotJSON when it is not JSON-serializable, holds NaN/Infinity, a NUL or a lone
    surrogate; ResultTooLarge when its UTF-8 text is longer than ``max_bytes``.
    """
    if value is None:
        return None
    try:
        text = _ENCODER.encode(value)
    except RecursionError:
        raise ResultNotJSON("the returned value is nested too deeply for JSON") from None
    except (TypeError, ValueError) as exc:
        raise ResultNotJSON(f"the returned value is not JSON: {exc}") from None
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ResultNotJSON("the returned value holds a lone surrogate (not UTF-8)") from None
    if "\\u0000" in text:
        raise ResultNotJSON("the returned value holds a NUL character, which jsonb cannot store")
    if size > max_bytes:
        raise ResultTooLarge(f"{size} bytes > {max_bytes} (QUEUE_MAX_RESULT_BYTES)")
    return text


class JobFailed(BrooqError):
    """The job ended without success, so it has no result: ``state`` (dead or canceled) and
    ``last_error`` say why. Catch a subclass for one of them."""

    def __init__(self, job_id: str, state: State, last_error: str | None) -> None:
        why = f": {last_error}" if last_error else ""
        super().__init__(f"job {job_id} ended {state}{why}")
        self.job_id, self.state, self.last_error = job_id, state, last_error


class JobDead(JobFailed):
    """The job is ``dead``: its last charged attempt failed (or its lease kept expiring)."""


class JobCanceled(JobFailed):
    """The job was ``canceled`` (by an operator, a CancelJob, or its workflow)."""


class ResultTimeout(BrooqError, TimeoutError):
    """The job had not ended when the wait's timeout passed (it is pending, retrying or
    running); wait again, or look at it with ``brooq job``."""

    def __init__(self, job_id: str, state: State, timeout: float) -> None:
        super().__init__(f"job {job_id} is still {state} after {timeout:g}s")
        self.job_id, self.state, self.timeout = job_id, state, timeout
