"""Ports lent to one page at a time: a page that finds none free is shed, never queued.

A supervisor serves the dashboard from its own process, beside the loop that
forks workers and answers /healthz; page readers must never hold either up.
At most :attr:`PortPool.size` pages use the database at once, each on ports
of its own; a page that finds every set taken is answered 503 at once, so
page requests cannot fill the server's connection slots, nor take the
loop's share of the interpreter. The reads of one page share one
:class:`PageBudget`: each read's ``statement_timeout`` is what is left of it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

from brooq.surface.dashboard.pages import DashboardPorts
from brooq.vocabulary import StoreUnavailable, format_duration

PAGES = 2
"""Pages that read the database at once; more are answered 503 and retry."""
PAGE_READ_BUDGET = timedelta(seconds=2)
"""All the reads of one page: past this PostgreSQL stops them and the page answers 503."""


class PageBudget:
    """The time left to one page's reads, restarted for each page."""

    def __init__(self, budget: timedelta = PAGE_READ_BUDGET) -> None:
        self.budget = budget
        self._deadline = time.monotonic() + budget.total_seconds()

    def start(self) -> None:
        """A new page begins: the whole budget is left."""
        self._deadline = time.monotonic() + self.budget.total_seconds()

    def left(self) -> timedelta:
        """What is left; StoreUnavailable when nothing is."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise StoreUnavailable(
                f"the page's reads took longer than {format_duration(self.budget)}"
            )
        return timedelta(seconds=left)


@dataclass(frozen=True)
class PortSet:
    """One page's ports, what starts its budget, and what closes its connections."""

    ports: DashboardPorts
    start: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None


class PortPool:
    """Sets of ports, each lent to one page at a time; a page finding none free gets None."""

    def __init__(self, sets: Sequence[PortSet]) -> None:
        if not sets:
            raise ValueError("a PortPool needs at least one set of ports")
        self._all = list(sets)
        self._free = list(sets)
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """How many pages may read at once."""
        return len(self._all)

    @contextlib.contextmanager
    def lease(self) -> Iterator[DashboardPorts | None]:
        """A free set of ports for the block (None when every set is lent: shed the page)."""
        with self._lock:
            lent = self._free.pop() if self._free else None
        if lent is None:
            yield None
            return
        lent.start()
        try:
            yield lent.ports
        finally:
            with self._lock:
                self._free.append(lent)

    def close(self) -> None:
        """Close every connection of every set (a page still reading gets an error)."""
        for lent in self._all:
            lent.close()
