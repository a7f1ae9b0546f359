"""Secrets in free text (issue 22, items 5 and 19): a short password is hidden where it is a
password, never inside the words and paths that hold the same letters; a long secret, the
token above all, wherever it appears, in every text of the process that knows it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from brooq.vocabulary import secrets
from brooq.vocabulary.secrets import scrub, scrub_json

TOKEN = "Zq9-operator-token-0123456789abcdef"


@pytest.fixture(autouse=True)
def no_known_secrets() -> Iterator[None]:
    saved = secrets.known_secrets()
    secrets.forget_secrets()
    yield
    secrets.forget_secrets()
    secrets.hide_everywhere(saved)


def test_a_short_password_is_hidden_where_it_is_a_password_never_inside_words_or_paths() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/brooq/engine/executor.py", line 3, in run\n'
        "    raise brooq.Delay(5)\n"
        "from brooq_app.tasks import send; user brooq\n"
        "postgresql://brooq:brooq@db:5432/brooq?sslmode=disable\n"
        "host=db password=brooq port=5432\n"
        "{'password': 'brooq', \"again\": \"brooq\"}\n"
        "RuntimeError: brooq\n"
        "brooq\n"
    )
    assert scrub(text, ["brooq"]) == (
        "Traceback (most recent call last):\n"
        '  File "/srv/brooq/engine/executor.py", line 3, in run\n'
        "    raise brooq.Delay(5)\n"
        "from brooq_app.tasks import send; user brooq\n"
        "postgresql://brooq:***@db:5432/brooq?sslmode=disable\n"
        "host=db password=*** port=5432\n"
        "{'password': '***', \"again\": \"***\"}\n"
        "RuntimeError: ***\n"
        "***\n"
    )


def test_a_long_secret_is_hidden_wherever_it_appears() -> None:
    text = f"environ({{'BROOQ_TOKEN': '{TOKEN}'}}) and glued:x{TOKEN}y"
    assert TOKEN not in scrub(text, [TOKEN])
    assert scrub(text, [TOKEN]).count("***") == 2


def test_secrets_the_process_was_given_are_hidden_in_every_text_without_naming_them() -> None:
    text = f"RuntimeError: env has {TOKEN} and password: brooq"
    assert scrub(text) == text
    secrets.hide_everywhere([TOKEN, "brooq", None, ""])
    assert scrub(text) == "RuntimeError: env has *** and password: ***"
    assert secrets.known_secrets() == (TOKEN, "brooq")


def test_a_result_is_scrubbed_string_by_string_and_stays_json() -> None:
    # Issue 32, item 3: a result is JSON text; each string is scrubbed on its own.
    value = {
        "dsn": "postgresql://u:pw-1234567@db/x",
        "next": "x@y",  # a URL pattern over the whole text would eat up to this "@"
        TOKEN: [f'say "{TOKEN}"', 'quoted "pass\\word"'],
        "deep": [[[{"k": TOKEN}]]],
        "n": 1.5,
        "ok": None,
    }
    text = json.dumps(value, separators=(",", ":"))
    got = json.loads(scrub_json(text, [TOKEN, "pass\\word"]))
    assert got == {
        "dsn": "postgresql://u:***@db/x",
        "next": "x@y",
        "***": ['say "***"', 'quoted "***"'],
        "deep": [[[{"k": "***"}]]],
        "n": 1.5,
        "ok": None,
    }


def test_a_result_without_secrets_is_kept_as_written() -> None:
    text = '{"sum":3,"words":["a","b"]}'
    assert scrub_json(text, [TOKEN]) is text
    assert scrub_json(json.dumps(TOKEN), [TOKEN]) == '"***"'


def test_a_result_nested_as_deep_as_json_allows_is_scrubbed() -> None:
    # Deeper than a recursive walk could go: walked without recursion.
    text = "[" * 600 + json.dumps(TOKEN) + "]" * 600
    assert scrub_json(text, [TOKEN]) == "[" * 600 + '"***"' + "]" * 600
    # Deeper than this stack can decode: one string, scrubbed, still JSON.
    deeper = "[" * 5000 + json.dumps(TOKEN) + "]" * 5000
    assert json.loads(scrub_json(deeper, [TOKEN])) == "[" * 5000 + '"***"' + "]" * 5000
