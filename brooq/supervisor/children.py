"""The parent's view of its children: who runs what, and until when it may."""

from __future__ import annotations

from dataclasses import dataclass, field

from brooq.engine.store import Ticket
from brooq.supervisor.protocol import Reader


@dataclass
class InFlight:
    """A job a child reported claimed, with the watchdog's deadlines (monotonic seconds)."""

    ticket: Ticket
    topic: str
    started: float
    hard_deadline: float | None
    hung_deadline: float | None
    grace_s: float
    interrupted: str | None = None
    interrupted_at: float = 0.0

    def kill_due(self, now: float) -> str | None:
        """Why the child must be SIGKILLed now, or None.

        ``hung:<reason>`` when an interrupted handler outlived its grace (the
        soft attempt timeout counts as an interrupt); ``max_execution`` when
        the hard limit passed.
        """
        if self.interrupted is not None and now >= self.interrupted_at + self.grace_s:
            return f"hung:{self.interrupted}"
        if self.hard_deadline is not None and now >= self.hard_deadline:
            return "max_execution"
        if self.hung_deadline is not None and now >= self.hung_deadline:
            return "hung:attempt_timeout"
        return None

    def next_deadline(self) -> float | None:
        """The earliest moment :meth:`kill_due` may change its answer."""
        times = [t for t in (self.hard_deadline, self.hung_deadline) if t is not None]
        if self.interrupted is not None:
            times.append(self.interrupted_at + self.grace_s)
        return min(times) if times else None


@dataclass
class WorkerProcess:
    """One forked child."""

    slot: int
    pid: int
    reader: Reader
    started: float
    generation: int
    holder: str
    metrics_id: str = "w0"
    booted: bool = False
    job: InFlight | None = None
    retiring: bool = False
    kill_reason: str | None = None
    recycle_reason: str | None = None
    pipe_closed: bool = False
    signals_sent: list[str] = field(default_factory=list)
