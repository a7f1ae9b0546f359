"""Routes: exact paths and regular expressions → handler callables, per method.

A handler takes a :class:`Request` and returns a :class:`Response`. Handlers
run in the server's threads, several at once: whatever they touch must be
thread-safe (their own database connection, immutable snapshots, locks).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable

from brooq.surface.wire import Request, Response

Handler = Callable[[Request], Response]


class Router:
    """Finds the handler of a request: exact paths first, then patterns in the order added.

    ``HEAD`` is served by the ``GET`` handler (the server drops the body). A
    path served under other methods answers 405 with ``Allow``; an unknown
    path 404.
    """

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[re.Pattern[str], dict[str, Handler]]] = []

    def add(self, methods: str | Iterable[str], path: str, handler: Handler) -> None:
        """Serve ``path`` (exact) with ``handler`` for ``methods`` (e.g. ``"GET"``)."""
        table = self._exact.setdefault(path, {})
        self._register(table, methods, handler, path)

    def add_pattern(self, methods: str | Iterable[str], pattern: str, handler: Handler) -> None:
        """Serve paths that fully match ``pattern``; its named groups become ``request.params``."""
        compiled = re.compile(pattern)
        for existing, table in self._patterns:
            if existing.pattern == compiled.pattern:
                self._register(table, methods, handler, pattern)
                return
        table = {}
        self._register(table, methods, handler, pattern)
        self._patterns.append((compiled, table))

    @staticmethod
    def _register(
        table: dict[str, Handler], methods: str | Iterable[str], handler: Handler, where: str
    ) -> None:
        for method in [methods] if isinstance(methods, str) else list(methods):
            if method.upper() in table:
                raise ValueError(f"{method.upper()} {where} is already routed")
            table[method.upper()] = handler

    def dispatch(self, request: Request) -> Response:
        """The handler's answer to ``request`` (404/405 when no route takes it)."""
        table, params = self._exact.get(request.path), {}
        if table is None:
            for pattern, candidate in self._patterns:
                match = pattern.fullmatch(request.path)
                if match:
                    table, params = candidate, match.groupdict()
                    break
        if table is None:
            return Response.json(404, {"error": "not found"})
        method = "GET" if request.method == "HEAD" else request.method
        handler = table.get(method)
        if handler is None:
            allowed = ", ".join(sorted(table))
            return Response.json(
                405, {"error": f"method not allowed; use {allowed}"}, headers=[("Allow", allowed)]
            )
        return handler(dataclasses.replace(request, params=params) if params else request)
