"""Who may listen where, and who may call the guarded endpoints: addresses and bearer tokens."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence

from brooq.config import values
from brooq.surface.wire import Request, Response
from brooq.vocabulary import InvalidInput

log = logging.getLogger("brooq.surface")

MIN_TOKEN_BYTES = values.MIN_TOKEN_BYTES
FAILED_GUESSES_PER_CLIENT = 5
FAILED_GUESS_WINDOW_S = 60.0
"""Past this many wrong tokens from one address in this window, its wrong tokens are 429."""
MAX_CLIENTS_TRACKED = 4096
"""Addresses whose failures are remembered at most; past this the quietest is forgotten."""


class SurfaceConfigError(InvalidInput):
    """HTTP_ADDR is not usable as given (not loopback without the flag, in use) or BROOQ_TOKEN
    is too weak."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) into a pair; port 0 picks a free port.

    The settings' parser (brooq.config.values.parse_addr), raising SurfaceConfigError.
    """
    try:
        return values.parse_addr(addr)
    except ValueError as exc:
        raise SurfaceConfigError(f"HTTP_ADDR: {exc}") from None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (an empty host means every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, allow_remote: bool) -> None:
    """Refuse a weak token anywhere, and a non-loopback address unless allowed and guarded.

    On the network the token is all that stands between anyone and the
    cancel endpoint; a short one could be guessed, so it is refused at start
    (on loopback too: any local user, or a page of any site through DNS
    rebinding, could guess it there as well).
    """
    if token and (problem := values.token_problem(token)):
        raise SurfaceConfigError(f"BROOQ_TOKEN: {problem}")
    if is_loopback(host):
        return
    if not allow_remote:
        raise SurfaceConfigError(
            f"HTTP_ADDR host {host!r} is not loopback; pass --http-allow-remote (and set a "
            "token) to expose the surface, or put it behind a proxy"
        )
    if not token:
        raise SurfaceConfigError(
            f"HTTP_ADDR host {host!r} is not loopback: set BROOQ_TOKEN first (at least "
            f"{MIN_TOKEN_BYTES} bytes, e.g. the output of `openssl rand -hex 32`)"
        )


class HostGuard:
    """Which ``Host`` headers the surface answers: its own address and the names configured.

    DNS rebinding: a page of another site resolves its own name to this
    address, and the browser then reads (and, with a session, acts on)
    what the surface serves, sending that other name as ``Host``. The
    address itself (an IP literal), ``localhost`` for a loopback address,
    any IP literal for a wildcard address (0.0.0.0, ::), and the names of
    HTTP_ALLOWED_HOSTS pass; any other name does not. A request without
    ``Host`` (HTTP/1.0 tools; no browser omits it) passes too.
    """

    def __init__(self, bound_host: str, names: Sequence[str] = ()) -> None:
        self.bound = bound_host.strip("[]").lower()
        self.names = {name.strip().rstrip(".").lower() for name in names if name.strip()}
        self.wildcard = self.bound in ("", "0.0.0.0", "::")

    def allows(self, request: Request) -> bool:
        """True when ``request`` names this server in its ``Host`` header (or names nothing)."""
        values = request.header_values("host")
        if not values:
            return True
        if len(values) > 1:
            return False
        host = _host_name(values[0])
        if host is None:
            return False
        if host in self.names or host == self.bound:
            return True
        if host == "localhost" or self.bound == "localhost":
            return is_loopback(host) and is_loopback(self.bound)
        try:
            given = ipaddress.ip_address(host)
        except ValueError:
            return False  # a name nobody configured: the rebinding case
        return self.wildcard or _same_ip(given, self.bound)


def _host_name(header: str) -> str | None:
    """The host of a ``Host`` header without its port, lower case; None when malformed."""
    text = header.strip().lower()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        return host
    host, _, port = text.partition(":")
    if port and not port.isdigit():
        return None
    host = host.rstrip(".")
    return host if host and all(c.isalnum() or c in "-._" for c in host) else None


def _same_ip(given: ipaddress.IPv4Address | ipaddress.IPv6Address, bound: str) -> bool:
    try:
        return given == ipaddress.ip_address(bound)
    except ValueError:
        return False


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def token_matches(given: str, token: str) -> bool:
    """Constant-time comparison; hashing first hides the token's length too."""
    return hmac.compare_digest(_digest(given), _digest(token))


def client_address(request: Request) -> str:
    """The address of ``request``'s client, without its port."""
    return request.client.rpartition(":")[0] or request.client


class GuessThrottle:
    """Wrong tokens per client address over a sliding window: bounded, logged, never a lockout.

    Every wrong token (a login, a bearer header) is counted against its
    address. Up to FAILED_GUESSES_PER_CLIENT a window, each is logged at
    warning (address and path, never the token); past it one
    ``TokenGuessesThrottled`` line says so and the address's wrong tokens are
    answered 429 with Retry-After. The right token is never refused, throttled
    or not: everyone behind one proxy, or every local user on loopback, shares
    an address, so refusing it would let any of them lock the operator out;
    and a token of 32 bytes or more (the least brooq accepts) cannot be
    guessed at any rate, so refusing it would protect nothing. Safe to share
    between threads (the service endpoints and the dashboard share one).
    """

    def __init__(
        self,
        per_client: int = FAILED_GUESSES_PER_CLIENT,
        window_s: float = FAILED_GUESS_WINDOW_S,
        max_clients: int = MAX_CLIENTS_TRACKED,
    ) -> None:
        self.per_client, self.window_s, self.max_clients = per_client, window_s, max_clients
        self._by_client: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def failed(self, request: Request, event: str) -> float:
        """Count one wrong token of ``request``'s client and log it as ``event`` while under
        the bound; the seconds its wrong tokens are refused from now on (0: not throttled)."""
        client, now = client_address(request), time.monotonic()
        with self._lock:
            seen = self._by_client.pop(client, None) or deque()
            while seen and seen[0] <= now - self.window_s:
                seen.popleft()
            was_throttled = len(seen) > self.per_client
            seen.append(now)
            while len(seen) > self.per_client + 1:
                seen.popleft()  # only the last per_client + 1 matter for the bound
            self._by_client[client] = seen
            while len(self._by_client) > self.max_clients:
                self._by_client.popitem(last=False)
            count, first = len(seen), seen[0]
        fields = {"client": client, "path": request.path}
        if count <= self.per_client:
            log.warning("wrong token from %s", client, extra={"event": event, **fields})
            return 0.0
        wait = max(0.1, first + self.window_s - now)
        if not was_throttled:  # one line as it starts, not one per wrong token
            log.warning(
                "more than %d wrong tokens from %s within %gs: its wrong tokens are answered "
                "429 (the right token is still accepted)",
                self.per_client,
                client,
                self.window_s,
                extra={"event": "TokenGuessesThrottled", **fields},
            )
        return wait


def refuse_unless_bearer(
    request: Request, token: str | None, throttle: GuessThrottle | None = None
) -> Response | None:
    """None when ``request`` carries ``Authorization: Bearer <token>``; else the refusal.

    404 when no token is configured (the guarded endpoints do not exist),
    400 for two Authorization headers (which one would a proxy have checked?),
    401 with ``WWW-Authenticate: Bearer`` for a missing or wrong token. The
    scheme is case-insensitive (RFC 7235). A wrong one is counted by
    ``throttle`` (logged; 429 with Retry-After past its bound); a missing
    one is no guess.
    """
    if not token:
        return Response.json(
            404, {"error": "this endpoint is disabled: no token is configured (set BROOQ_TOKEN)"}
        )
    values = request.header_values("authorization")
    if len(values) > 1:
        return Response.json(400, {"error": "more than one Authorization header"})
    scheme, _, credentials = (values[0] if values else "").strip().partition(" ")
    if scheme.lower() == "bearer" and token_matches(credentials.strip(" "), token):
        return None
    wait = throttle.failed(request, "BearerTokenRejected") if throttle and values else 0.0
    if wait > 0:
        return Response.json(
            429,
            {"error": "too many wrong tokens from this address; try again later"},
            headers=[("Retry-After", str(math.ceil(wait)))],
        )
    return Response.json(
        401,
        {"error": "missing or wrong bearer token"},
        headers=[("WWW-Authenticate", 'Bearer realm="brooq"')],
    )
