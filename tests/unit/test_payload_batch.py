"""The batch encoder of a bulk enqueue says exactly what the one-payload encoder says."""

from __future__ import annotations

from typing import Any

import pytest

from brooq.vocabulary import InvalidJob
from brooq.vocabulary.payload import encode_payload, encode_payloads

GOOD: list[Any] = [
    {"i": 1},
    {"text": "é ☃ 𝄞", "tab": "a\tb", "back": "\\"},
    {"nested": [{"a": None}, True, 1.5, -0.0, 10**30]},
    {1: "int key"},
    [1, 2],
    "text",
    None,
    {"big": "x" * 90},
]


def circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def test_the_batch_encodes_as_one_payload_at_a_time() -> None:
    assert encode_payloads(GOOD, max_bytes=100) == [encode_payload(p, max_bytes=100) for p in GOOD]


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"n": float("nan")}, "NaN"),
        ({"o": object()}, "not JSON serializable"),
        ({"nul": "a\x00b"}, "NUL"),
        ({"s": "\ud800"}, "lone surrogate"),
        ({"big": "é" * 60}, "above the limit of 100"),  # 120 bytes in 60 characters
        (circular(), "Circular reference"),
    ],
)
def test_the_batch_refuses_what_one_payload_refuses(bad: Any, why: str) -> None:
    with pytest.raises(InvalidJob, match=why):
        encode_payload(bad, max_bytes=100)
    with pytest.raises(InvalidJob, match=why):
        encode_payloads([*GOOD, bad], max_bytes=100)


DICTS: list[Any] = [
    {"i": 1},
    {"text": "é ☃ 𝄞"},  # not ASCII: its bytes, not its characters, count
    {"literal": "\\u0000"},  # a backslash and "u0000", not a NUL: kept
    {"tab": "a\tb", "back": "\\", "nl": "\n\r"},
    {"big": "x" * 80},
]


def test_a_batch_of_dicts_checked_at_once_encodes_as_one_payload_at_a_time() -> None:
    # Issue 32: a batch of dicts is checked as a whole (no \u0000, ASCII, short enough)
    # and only otherwise one payload at a time; the texts are the same either way.
    for batch in ([DICTS[0]] * 5, DICTS, DICTS[::-1], [], [DICTS[4]] * 3):
        one_by_one = [encode_payload(p, max_bytes=100) for p in batch]
        assert encode_payloads(batch, max_bytes=100) == one_by_one
        assert encode_payloads(iter(batch), max_bytes=100) == one_by_one


@pytest.mark.parametrize(
    ("batch", "why"),
    [
        ([{"i": 1}, {"big": "x" * 200}, {"i": 2}], "is 210 bytes encoded, above the limit of 100"),
        ([{"i": 1}, {"big": "é" * 60}], "is 130 bytes encoded, above the limit of 100"),
        ([{"nul": "\x00"}, {"o": object()}], "NUL"),  # the first bad one, in order
        ([{"o": object()}, {"nul": "\x00"}], "not JSON serializable"),
        ([{"n": float("nan")}, "x" * 200], "NaN"),
        (["x" * 200, {"n": float("nan")}], "above the limit"),
    ],
)
def test_the_first_bad_payload_of_a_batch_says_what_is_wrong(batch: list[Any], why: str) -> None:
    with pytest.raises(InvalidJob, match=why):
        encode_payloads(batch, max_bytes=100)
