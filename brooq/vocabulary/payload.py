"""Payloads are opaque JSON: brooq encodes them once and never looks inside."""

from __future__ import annotations

import json
from collections.abc import Iterable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, cast

from brooq.vocabulary.errors import InvalidJob

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_PAYLOAD_BYTES_LIMIT = 16 * 1024 * 1024
"""The largest QUEUE_MAX_PAYLOAD_BYTES: a quarter of the 64 MiB frame that carries a job to
its worker, where escaping and PostgreSQL's spacing make the payload's text longer."""


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
"""One encoder for every payload (``json.dumps`` with options builds one per call)."""
_FAST: Any = None
if c_make_encoder is not None:
    # _ENCODER's own C encoder, made once rather than at each call as encode() does, and
    # without the table of containers it is inside (shared, a table would be wrong across
    # threads): a payload that holds itself recurses until RecursionError, and is then
    # encoded again by _ENCODER, which names the cycle.
    _FAST = c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode a payload as JSON text that PostgreSQL's jsonb accepts.

    Raises :class:`InvalidJob` when the value is not JSON-serializable, holds
    NaN/Infinity, a NUL character (jsonb cannot store it) or a lone surrogate,
    or encodes to more than ``max_bytes`` UTF-8 bytes.
    """
    try:
        text = _encode(payload)
    except RecursionError:
        raise InvalidJob("payload is nested too deeply to encode as JSON; flatten it") from None
    except (TypeError, ValueError) as exc:
        hint = " (NaN and Infinity are not JSON)" if "Out of range float" in str(exc) else ""
        raise InvalidJob(f"payload is not JSON-serializable: {exc}{hint}") from None
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidJob(
            "payload holds a lone surrogate character that is not valid UTF-8; "
            "decode your text properly before enqueueing"
        ) from None
    if size > max_bytes:
        raise InvalidJob(
            f"payload is {size} bytes encoded, above the limit of {max_bytes} "
            "(QUEUE_MAX_PAYLOAD_BYTES); store large data elsewhere and enqueue a reference"
        )
    if "\\u0000" in text and _holds_nul(payload):
        raise InvalidJob(
            "payload holds a NUL character (\\u0000), which PostgreSQL jsonb cannot store; "
            "strip it or base64-encode binary data"
        )
    return text


def encode_payloads(payloads: Iterable[Any], *, max_bytes: int) -> list[str]:
    """:func:`encode_payload` of each payload, in order: the same text, checks and errors
    (a bulk enqueue encodes thousands).

    Dict payloads go through the prebuilt C encoder; the checks that find nothing in the
    common case (no ``\\u0000``, ASCII, short) are made once on the whole batch. Whatever
    does not pass them goes through :func:`encode_payload`, one payload at a time in order,
    so the first bad payload raises its own error.
    """
    payloads = list(payloads)
    fast, join = _FAST, "".join
    texts: list[str | None] = []
    every = fast is not None  # every payload encoded by the C encoder
    for payload in payloads:
        if fast is not None and type(payload) is dict:
            try:
                texts.append(join(fast(payload, 0)))
                continue
            except Exception:
                pass  # encode_payload below says what is wrong
        texts.append(None)
        every = False
    if every and _batch_fits(done := cast(list[str], texts), max_bytes):
        return done
    return [
        text
        if (text := texts[i]) is not None and "\\u0000" not in text and _fits(text, max_bytes)
        else encode_payload(payload, max_bytes=max_bytes)
        for i, payload in enumerate(payloads)
    ]


def _batch_fits(texts: list[str], max_bytes: int) -> bool:
    """True when no text holds ``\\u0000`` and each is ASCII of at most ``max_bytes``
    (then each passes encode_payload's checks); False says: check them one by one."""
    whole = "".join(texts)
    return (
        "\\u0000" not in whole and whole.isascii() and max(map(len, texts), default=0) <= max_bytes
    )


def _fits(text: str, max_bytes: int) -> bool:
    """True when ``text`` is valid UTF-8 of at most ``max_bytes`` bytes."""
    if text.isascii():
        return len(text) <= max_bytes
    try:
        return len(text.encode("utf-8")) <= max_bytes
    except UnicodeEncodeError:
        return False


def _encode(payload: Any) -> str:
    """JSON text of ``payload`` as _ENCODER writes it (see _FAST)."""
    if _FAST is None or isinstance(payload, str):
        return _ENCODER.encode(payload)
    try:
        return "".join(_FAST(payload, 0))
    except RecursionError:
        return _ENCODER.encode(payload)  # "Circular reference detected", or too deep again


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def decode_payload(text: str | bytes) -> Any:
    """Decode JSON text read back from the database."""
    return json.loads(text)


UNDECODABLE = "payload cannot be decoded"


def decode_stored_payload(text: str) -> tuple[Any, str | None]:
    """``(payload, None)``, or ``(None, why)`` when Python cannot decode the stored JSON.

    jsonb happily stores what Python's json refuses: integers of more than
    4,300 digits, arrays nested deeper than the recursion limit (the SQL path
    of docs/operations.md takes any of them). Whoever reads such a row gets
    the reason instead of an exception.
    """
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, f"{UNDECODABLE}: {str(exc)[:200]}"
