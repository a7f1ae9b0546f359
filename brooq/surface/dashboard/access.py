"""Who may see and act on the dashboard: the bearer token, login sessions, and CSRF tokens.

Without BROOQ_TOKEN the dashboard is read-only for everyone. With it, every
page needs a session: an operator logs in once with the token and gets a
session of their own (a random id, kept by this process and no other, that
ends after :data:`SESSION_TTL`, at logout, or at a restart). The cookie
holds only that id (HttpOnly, SameSite=Strict, Path=/ui; Secure when the
request came over TLS or remote access is on). Each session has its own
CSRF token, which every form carries: a state-changing request needs the
session (cookie or ``Authorization: Bearer``), a matching CSRF token for a
cookie session, and no foreign ``Origin``; so does the login itself, so that
no page of another site can post guesses from the operator's browser. Wrong
tokens (a login, a bearer header) are counted per client address by a
:class:`~brooq.surface.guard.GuessThrottle`: logged at warning, answered 429
past its bound, and the right token is never refused.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from urllib.parse import urlsplit

from brooq.surface.guard import GuessThrottle, client_address, token_matches
from brooq.surface.wire import Request

log = logging.getLogger("brooq.surface")

COOKIE = "brooq_session"
COOKIE_PATH = "/ui"
SESSION_TTL = timedelta(hours=12)
"""A session ends this long after its login, whatever it does meanwhile."""
MAX_SESSIONS = 1000
"""Sessions kept at most; past this the oldest ends (each login makes one)."""


class Verdict(StrEnum):
    """What a request may do."""

    READ_ONLY = "read_only"
    """No token configured: anyone may read, nobody may act."""
    ANONYMOUS = "anonymous"
    """A token is configured and this request carries no session: it may only log in."""
    THROTTLED = "throttled"
    """It carries a wrong bearer token, and its address sent too many: answered 429."""
    ALLOWED = "allowed"


@dataclass(frozen=True)
class Session:
    """One login: its CSRF token and when it ends (time.monotonic())."""

    csrf: str
    ends: float


class Sessions:
    """The sessions of this process; safe to share between threads."""

    def __init__(self, ttl: timedelta = SESSION_TTL, limit: int = MAX_SESSIONS) -> None:
        self.ttl_s, self.limit = ttl.total_seconds(), limit
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self) -> str:
        """A new session; its id (the cookie's value)."""
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._by_id[sid] = Session(secrets.token_hex(32), time.monotonic() + self.ttl_s)
            while len(self._by_id) > self.limit:
                self._by_id.popitem(last=False)
        return sid

    def get(self, sid: str) -> Session | None:
        """The live session ``sid``, or None (unknown, ended or expired)."""
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(sid)
            if session is not None and session.ends <= time.monotonic():
                del self._by_id[sid]
                session = None
        return session

    def end(self, sid: str) -> None:
        """End session ``sid`` (a logout): its cookie is worth nothing from now on."""
        with self._lock:
            self._by_id.pop(sid, None)


@dataclass(frozen=True)
class LoginAnswer:
    """How a login attempt ends: a session cookie, or a status and why."""

    cookie: str | None = None
    status: int = 303
    why: str = ""
    retry_after_s: float = 0.0


class Access:
    """The dashboard's access rules for one configured token (None: read-only).

    ``remote`` (HTTP_ALLOW_REMOTE) marks every session cookie Secure, as
    does a request that came through a TLS-terminating proxy.
    """

    def __init__(
        self, token: str | None, remote: bool = False, throttle: GuessThrottle | None = None
    ) -> None:
        self.token, self.remote = token or None, remote
        self.sessions = Sessions()
        self.throttle = throttle or GuessThrottle()

    def verdict(self, request: Request) -> Verdict:
        """Whether ``request`` carries a valid session (cookie or bearer header); a wrong
        bearer token is counted by the throttle."""
        if not self.token:
            return Verdict.READ_ONLY
        if self._session(request) is not None or self._bearer_ok(request):
            return Verdict.ALLOWED
        guessed = bool(request.header_values("authorization"))
        if guessed and self.throttle.failed(request, "BearerTokenRejected") > 0:
            return Verdict.THROTTLED
        return Verdict.ANONYMOUS

    def csrf_for(self, request: Request) -> str:
        """The CSRF token the forms of a page for ``request`` carry ("" without a session)."""
        session = self._session(request)
        return session.csrf if session is not None else ""

    def login(self, request: Request, given: str) -> LoginAnswer:
        """Check ``given`` against the token; a new session's cookie, or why not.

        A login posted from another site (a foreign ``Origin`` or ``Referer``) is refused
        before the token is looked at, and counts nothing. A wrong token is counted
        against the client's address (429 past the throttle's bound); the right one is
        never refused.
        """
        client = client_address(request)
        if not same_origin(request):
            log.warning(
                "dashboard login refused: posted from another site",
                extra={"event": "DashboardLoginRefused", "client": client},
            )
            return LoginAnswer(None, 403, "the login was posted from another site")
        if not (self.token and token_matches(given, self.token)):
            wait = self.throttle.failed(request, "DashboardLoginFailed")
            if wait > 0:
                why = "too many wrong tokens from this address; the right token still logs in"
                return LoginAnswer(None, 429, why, wait)
            return LoginAnswer(None, 401, "wrong token")
        sid = self.sessions.open()
        log.info("dashboard login", extra={"event": "DashboardLogin", "client": client})
        age = int(self.sessions.ttl_s)
        return LoginAnswer(self._cookie(request, sid, f"Max-Age={age}"))

    def logout(self, request: Request, form: dict[str, list[str]]) -> tuple[int, str] | None:
        """End the request's session; None when done, else (status, why).

        A logout changes state, so it needs what an action needs: the
        session, its CSRF token, and no foreign Origin.
        """
        refusal = self.refuse_write(request, form)
        if refusal is not None:
            return refusal
        self.sessions.end(request.cookies.get(COOKIE, ""))
        return None

    def clear_cookie(self, request: Request) -> str:
        """The Set-Cookie value of a logout."""
        return self._cookie(request, "", "Max-Age=0")

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
        session = self._session(request)
        if session is None:
            return 401, "log in with the token first"
        given = (form.get("csrf") or [""])[0]
        if not hmac.compare_digest(given.encode(), session.csrf.encode()):
            return 403, "missing or wrong CSRF token: reload the page and try again"
        return None

    def _cookie(self, request: Request, value: str, age: str) -> str:
        secure = "; Secure" if self.remote or came_over_tls(request) else ""
        return f"{COOKIE}={value}; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict; {age}{secure}"

    def _session(self, request: Request) -> Session | None:
        if not self.token:
            return None
        return self.sessions.get(request.cookies.get(COOKIE, ""))

    def _bearer_ok(self, request: Request) -> bool:
        values = request.header_values("authorization")
        if len(values) != 1 or not self.token:
            return False
        scheme, _, given = values[0].strip().partition(" ")
        return scheme.lower() == "bearer" and token_matches(given.strip(), self.token)


def came_over_tls(request: Request) -> bool:
    """True when a proxy says the client used HTTPS (``X-Forwarded-Proto`` or ``Forwarded``).

    Trusting it can only make a cookie stricter: at worst a Secure cookie
    that a plain-HTTP browser does not send back.
    """
    proto = (request.header("x-forwarded-proto") or "").split(",")[0].strip().lower()
    forwarded = (request.header("forwarded") or "").lower().replace(" ", "")
    return proto == "https" or "proto=https" in forwarded


def same_origin(request: Request) -> bool:
    """False when ``Origin`` (or else ``Referer``) names a host other than ``Host``."""
    host = (request.header("host") or "").strip().lower()
    origin = request.header("origin") or request.header("referer")
    if not origin or origin == "null":
        return origin != "null"
    return urlsplit(origin).netloc.lower() == host
