"""Connection strings: what looks like one, and how to show one without its password.

The one place brooq hides DSN passwords: settings output, errors, logs and
the HTTP surface all go through :func:`redact_dsn` or :func:`scrub`. Plain
text only (no psycopg), so that configuration can use it before anything
connects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "***"
MALFORMED = (
    "the connection string is malformed (value hidden); check DATABASE_URL "
    "(percent-encode special characters of the password, e.g. % as %25)"
)

# A libpq key=value password: quoted ('…' with \' escapes) or unquoted, where an
# unquoted value may hold backslash-escaped spaces (`password=ab\ cd`).
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\])*\\?)", re.I)
# userinfo of any URL-like DSN inside free text: scheme://user:password@
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)\S*@", re.I)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.I)


def is_url(dsn: str) -> bool:
    """True for a ``postgres://`` or ``postgresql://`` URL."""
    return dsn.startswith(("postgres://", "postgresql://"))


def looks_like_dsn(dsn: str) -> bool:
    """True for a postgres URL or a libpq string naming a dbname or host."""
    return is_url(dsn) or re.search(r"(?:^|\s)(?:dbname|host|service)\s*=", dsn) is not None


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***``, in URL or libpq key=value form."""
    if not is_url(dsn):
        return _KV_PASSWORD.sub(rf"\1{REDACTED}", dsn)
    scheme, _, rest = dsn.partition("://")
    head, sep, query = rest.partition("?")
    # rpartition: an unencoded "@" inside the password must not end the userinfo early.
    userinfo, at, hostpart = head.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + REDACTED
    query = _QUERY_PASSWORD.sub(rf"\1{REDACTED}", "?" + query)[1:] if sep else query
    return f"{scheme}://{userinfo}{at}{hostpart}{sep}{query}"


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Free text (an error message, a log line) with every DSN password hidden.

    Passwords in URLs and ``password=`` pairs are replaced, and so is every
    non-empty string of ``secrets`` (a password taken from the DSN, a token)
    wherever it appears.
    """
    out = _QUERY_PASSWORD.sub(rf"\1{REDACTED}", _URL_PASSWORD.sub(rf"\1{REDACTED}@", text))
    out = _KV_PASSWORD.sub(rf"\1{REDACTED}", out)
    for secret in secrets:
        if secret and len(secret) >= 3:
            out = out.replace(secret, REDACTED)
    return out


def is_local(dsn: str) -> bool:
    """True when ``dsn`` names a server on this machine (loopback or a Unix socket)."""
    import psycopg

    try:
        host = str(psycopg.conninfo.conninfo_to_dict(dsn).get("host") or "localhost")
    except psycopg.Error:
        return False
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("/")
