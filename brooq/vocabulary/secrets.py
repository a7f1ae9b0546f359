"""Secrets in text: how to find a DSN's password, and how to hide every one in free text.

Plain text, stdlib only, so that every part of brooq can use it: the store
(``last_error``), the logs, configuration output and the HTTP surface.
Connection strings themselves (parsing, redacting one) are
:mod:`brooq.postgres.dsn`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Free text (an error message, a log line) with every DSN password hidden.

    Passwords in URLs and ``password=`` pairs are replaced, and so is every
    non-empty string of ``secrets`` (a password taken from the DSN, a token)
    wherever it appears.
    """
    out = QUERY_PASSWORD.sub(rf"\1{REDACTED}", URL_PASSWORD.sub(rf"\1{REDACTED}@", text))
    out = KV_PASSWORD.sub(rf"\1{REDACTED}", out)
    for secret in secrets:
        if secret and len(secret) >= 3:
            out = out.replace(secret, REDACTED)
    return out
