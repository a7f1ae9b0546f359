"""Secrets in text: how to find a DSN's password, and how to hide every one in free text.

Plain text, stdlib only, so that every part of brooq can use it: the store
(``last_error``), the logs, configuration output and the HTTP surface.
Connection strings themselves (parsing, redacting one) are
:mod:`brooq.postgres.dsn`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

REDACTED = "***"

# A libpq key=value password: quoted ('…' with \' escapes) or unquoted, where an
# unquoted value may hold backslash-escaped spaces (`password=ab\ cd`).
KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\])*\\?)", re.I)
# userinfo of any URL-like DSN inside free text: scheme://user:password@
URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)\S*@", re.I)
QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.I)


def is_url(dsn: str) -> bool:
    """True for a ``postgres://`` or ``postgresql://`` URL."""
    return dsn.startswith(("postgres://", "postgresql://"))


def dsn_passwords(dsn: str | None) -> list[str]:
    """The password of ``dsn`` as written and as decoded (both may show up in an error
    text); none when it has none or cannot be read. Plain text: never raises."""
    if not dsn:
        return []
    found: list[str] = []
    if is_url(dsn):
        userinfo = dsn.partition("://")[2].partition("?")[0].rpartition("@")[0]
        if ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            found += [raw, unquote(raw)]
        query = re.search(r"[?&]password=([^&#\s]*)", dsn, re.I)
        if query:
            found += [query.group(1), unquote(query.group(1))]
    else:
        for match in KV_PASSWORD.finditer(dsn):
            raw = match.group(2)
            found += [raw, re.sub(r"\\(.)", r"\1", raw.strip("'"))]
    return [p for p in dict.fromkeys(found) if p]


BARE_SECRET_MIN = 8
"""A secret this long is hidden wherever it appears; a shorter one only as a whole value."""
_known: tuple[str, ...] = ()
# A short secret ("brooq") is also a word, a path, a user name: it is hidden only
# where it stands as a value of its own: after `=` or `: `, in quotes, alone on
# its line; never inside a word, a path or a dotted name.
_VALUE_BEFORE = r"(?:^|(?<=['\"=:])|(?<=[=:][ \t]))"
_VALUE_AFTER = r"(?=$|['\"\s,;&)\]}])"


def hide_everywhere(secrets: Iterable[str | None]) -> None:
    """Have :func:`scrub` hide each of ``secrets`` (the DSN's password, BROOQ_TOKEN) in every
    text of this process from now on, and of the processes it forks."""
    global _known
    _known = tuple(sorted({s for s in (*_known, *secrets) if s}, key=len, reverse=True))


def forget_secrets() -> None:
    """Forget every secret given to :func:`hide_everywhere` (tests)."""
    global _known
    _known = ()


def known_secrets() -> tuple[str, ...]:
    """The secrets given to :func:`hide_everywhere`, longest first."""
    return _known


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Free text (an error message, a log line) with every password and known secret hidden.

    Passwords in URLs and ``password=`` pairs are replaced; so is each of
    ``secrets`` and of the secrets given to :func:`hide_everywhere`: wherever
    it appears when it is at least BARE_SECRET_MIN characters long, else
    only as a whole value (``password: brooq``, ``'brooq'``, a line of its
    own), so that a short password never garbles paths and names that hold
    the same word (``/srv/brooq/engine/executor.py``, ``brooq.Delay``).
    """
    out = QUERY_PASSWORD.sub(rf"\1{REDACTED}", URL_PASSWORD.sub(rf"\1{REDACTED}@", text))
    out = KV_PASSWORD.sub(rf"\1{REDACTED}", out)
    extra = sorted({s for s in secrets if s} - set(_known), key=len, reverse=True)
    for secret in (*_known, *extra):
        if secret not in out:
            continue
        if len(secret) >= BARE_SECRET_MIN:
            out = out.replace(secret, REDACTED)
        else:
            whole = re.compile(_VALUE_BEFORE + re.escape(secret) + _VALUE_AFTER, re.M)
            out = whole.sub(REDACTED, out)
    return out


_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def scrub_json(text: str, secrets: Iterable[str | None] = ()) -> str:
    """JSON text (a handler's result) with every password and known secret hidden in its
    strings, keys included, as :func:`scrub` hides them; still valid JSON.

    Each string is scrubbed on its own, decoded: a pattern run over the whole text
    could reach across the JSON around it (a URL's ``\\S*@`` does) or miss a
    secret that JSON escaped. Text that holds no escape and that :func:`scrub`
    leaves whole is returned unchanged without being decoded. Text nested deeper
    than this stack can decode becomes one JSON string, the text scrubbed whole:
    never a secret, never JSON that PostgreSQL would refuse.
    """
    wanted = tuple(secrets)
    if "\\" not in text and scrub(text, wanted) == text:
        return text
    try:
        root = json.loads(text)
    except RecursionError:
        return _JSON.encode(scrub(text, wanted))
    if isinstance(root, str):
        return _JSON.encode(scrub(root, wanted))
    # In place and without recursion: a result may nest as deep as JSON lets it.
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    node[i] = scrub(item, wanted)
                elif isinstance(item, list | dict):
                    stack.append(item)
        elif isinstance(node, dict):
            items = list(node.items())
            node.clear()
            for key, item in items:
                node[scrub(key, wanted)] = scrub(item, wanted) if isinstance(item, str) else item
                if isinstance(item, list | dict):
                    stack.append(item)
    return _JSON.encode(root)
