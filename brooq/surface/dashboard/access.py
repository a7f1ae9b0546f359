"""Who may act on the dashboard: the bearer token, its login cookie, and CSRF tokens.

Without BROOQ_TOKEN the dashboard is read-only. With it, an operator logs in
once with the token; the answer sets a cookie (HttpOnly, SameSite=Strict,
Path=/ui) whose value is derived from the token with HMAC, so the cookie
never carries the token itself, a restart keeps sessions valid, and changing
the token ends them all. Each form carries a CSRF token derived from the
session; a state-changing request needs the session (cookie or
``Authorization: Bearer``), a matching CSRF token for a cookie session, and
no foreign ``Origin``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from brooq.surface.guard import token_matches
from brooq.surface.wire import Request

COOKIE = "brooq_session"
COOKIE_PATH = "/ui"


class Verdict(StrEnum):
    """What a request may do."""

    READ_ONLY = "read_only"
    """No token configured: nobody may act."""
    ANONYMOUS = "anonymous"
    """A token is configured and this request does not carry a session."""
    ALLOWED = "allowed"


def _derive(token: str, purpose: str) -> str:
    return hmac.new(
        token.encode("utf-8", "surrogateescape"), purpose.encode(), hashlib.sha256
    ).hexdigest()


@dataclass(frozen=True)
class Access:
    """The dashboard's access rules for one configured token (None: read-only)."""

    token: str | None

    def session_value(self) -> str:
        """The cookie value of a logged-in operator (never the token itself)."""
        assert self.token
        return _derive(self.token, "brooq dashboard session")

    def csrf_for(self, request: Request) -> str:
        """The CSRF token the forms of a page for ``request`` carry ("" when none needed)."""
        if not self.token:
            return ""
        return _derive(self.token, "brooq dashboard csrf:" + self.session_value())

    def verdict(self, request: Request) -> Verdict:
        """Whether ``request`` carries a valid session (cookie or bearer header)."""
        if not self.token:
            return Verdict.READ_ONLY
        if self._bearer_ok(request) or self._cookie_ok(request):
            return Verdict.ALLOWED
        return Verdict.ANONYMOUS

    def login_ok(self, given: str) -> bool:
        """True when ``given`` is the configured token (constant time)."""
        return bool(self.token) and token_matches(given, self.token or "")

    def set_cookie(self) -> str:
        """The Set-Cookie value after a login."""
        return f"{COOKIE}={self.session_value()}; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict"

    @staticmethod
    def clear_cookie() -> str:
        """The Set-Cookie value of a logout."""
        return f"{COOKIE}=; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict; Max-Age=0"

    def refuse_write(self, request: Request, form: dict[str, list[str]]) -> tuple[int, str] | None:
        """None when ``request`` may change something; else (status, why).

        403 read-only (no token configured), 401 no session, 403 a foreign
        Origin or a cookie session without the right CSRF token.
        """
        if not self.token:
            return 403, "read-only: no BROOQ_TOKEN is configured, so no action is possible"
        if not same_origin(request):
            return 403, "the request comes from another site (Origin mismatch)"
        if self._bearer_ok(request):
            return None  # a script with the token: no cookie, so no cross-site forgery
        if not self._cookie_ok(request):
            return 401, "log in with the token first"
        given = (form.get("csrf") or [""])[0]
        if not hmac.compare_digest(given.encode(), self.csrf_for(request).encode()):
            return 403, "missing or wrong CSRF token: reload the page and try again"
        return None

    def _bearer_ok(self, request: Request) -> bool:
        values = request.header_values("authorization")
        if len(values) != 1 or not self.token:
            return False
        scheme, _, given = values[0].strip().partition(" ")
        return scheme.lower() == "bearer" and token_matches(given.strip(), self.token)

    def _cookie_ok(self, request: Request) -> bool:
        given = request.cookies.get(COOKIE, "")
        return bool(given) and hmac.compare_digest(given.encode(), self.session_value().encode())


def same_origin(request: Request) -> bool:
    """False when ``Origin`` (or else ``Referer``) names a host other than ``Host``."""
    host = (request.header("host") or "").strip().lower()
    origin = request.header("origin") or request.header("referer")
    if not origin or origin == "null":
        return origin != "null"
    return urlsplit(origin).netloc.lower() == host
