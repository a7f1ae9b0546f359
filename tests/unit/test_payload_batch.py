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
