"""Connection strings: what looks like one, and how to show one without its password.

Settings output, errors, logs and the HTTP surface all go through
:func:`redact_dsn` or :func:`scrub` (whose patterns live, with the other
plain-text secret helpers, in :mod:`brooq.vocabulary.secrets`). Plain text
only (no psycopg), so that configuration can use it before anything
connects.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

from brooq.vocabulary.secrets import (
    KV_PASSWORD,
    QUERY_PASSWORD,
    REDACTED,
    dsn_passwords,
    is_url,
    scrub,
)

__all__ = [
    "MALFORMED",
    "REDACTED",
    "dsn_passwords",
    "is_local",
    "is_url",
    "looks_like_dsn",
    "redact_dsn",
    "scrub",
]

MALFORMED = (
    "the connection string is malformed (value hidden); check DATABASE_URL "
    "(percent-encode special characters of the password, e.g. % as %25)"
)


def looks_like_dsn(dsn: str) -> bool:
    """True for a postgres URL or a libpq string naming a dbname or host."""
    return is_url(dsn) or re.search(r"(?:^|\s)(?:dbname|host|service)\s*=", dsn) is not None


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***``, in URL or libpq key=value form."""
    if not is_url(dsn):
        return KV_PASSWORD.sub(rf"\1{REDACTED}", dsn)
    scheme, _, rest = dsn.partition("://")
    head, sep, query = rest.partition("?")
    # rpartition: an unencoded "@" inside the password must not end the userinfo early.
    userinfo, at, hostpart = head.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + REDACTED
    query = QUERY_PASSWORD.sub(rf"\1{REDACTED}", "?" + query)[1:] if sep else query
    return f"{scheme}://{userinfo}{at}{hostpart}{sep}{query}"


_KV_HOST = re.compile(r"(?:^|\s)host\s*=\s*'?([^'\s]*)")


def is_local(dsn: str) -> bool:
    """True when ``dsn`` names a server on this machine (loopback, a Unix socket, or no host)."""
    if is_url(dsn):
        parts = urlsplit(dsn)
        host = unquote(parts.hostname or "") or dict(parse_qsl(parts.query)).get("host", "")
    else:
        match = _KV_HOST.search(dsn)
        host = match[1] if match else ""
    return host in ("", "127.0.0.1", "localhost", "::1") or host.startswith("/")
