"""What one held-snapshot run saw (benchmarks/snapshot.py), interval by interval, and the
figures drawn from it: rates, pickup percentiles, peaks, the time to recover."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import percentile

PHASES = ("clean", "held", "recovery")
BACK_WITHIN = 0.10
"""Recovered: the rate of an interval within 10% of the clean rate (at max load: at least
90% of it; at half load: within ±10%, so an interval still working off the backlog that
the held phase left is not yet back)."""

Figure = tuple[float, str, bool, str]
"""value, unit, higher is better, label."""


@dataclass(frozen=True)
class Sample:
    """What the database showed at the end of an interval (``at``: seconds from the start)."""

    depth: int
    dead: int
    dead_by_table: dict[str, int]
    autovacuums: int
    probe_ms: float
    probe_pages: int
    at: float = 0.0
    phase: str = ""


@dataclass
class Run:
    """One pressure and load through clean → held → recovery."""

    pressure: str
    load: str
    interval_s: float
    samples: list[Sample]
    """One per interval, in order; ``samples[k]`` closes interval k."""
    marks: dict[str, float]
    """When each phase began (seconds from the start; the pressure opened or closed)."""
    load_rate: float | None
    """``half``: the producer's rate (jobs/s); ``max``: None."""
    starts: list[float] = field(default_factory=list)
    """When each job's handler started (seconds from the start), in order."""
    pickup_ms: list[float] = field(default_factory=list)
    """Its pickup latency: the handler's start − its enqueue batch's commit (same order)."""

    def fill(self, starts: list[tuple[float, int]], committed: list[float], t0: float) -> None:
        """Take the handlers' (wall-clock start, batch) records and the batches' commit
        times (wall clock); ``t0`` is the wall-clock start of the clean phase."""
        self.starts = [at - t0 for at, _ in starts]
        self.pickup_ms = [(at - committed[batch]) * 1000 for at, batch in starts]

    @property
    def end(self) -> float:
        """The end of the last interval (nominal)."""
        return len(self.samples) * self.interval_s

    def window(self, phase: str) -> tuple[float, float]:
        """The phase's span: from its mark to the next phase's (or the end)."""
        i = PHASES.index(phase)
        hi = self.marks.get(PHASES[i + 1], self.end) if i + 1 < len(PHASES) else self.end
        return self.marks[phase], hi

    def _index(self, lo: float, hi: float) -> tuple[int, int]:
        """The positions in ``starts`` of the jobs started in [lo, hi)."""
        return bisect.bisect_left(self.starts, lo), bisect.bisect_left(self.starts, hi)

    def rate(self, lo: float, hi: float) -> float:
        """Jobs started per second in [lo, hi)."""
        first, end = self._index(lo, hi)
        return (end - first) / max(hi - lo, 1e-9)

    def pickup(self, lo: float, hi: float, pct: float) -> float | None:
        """The ``pct`` percentile of the pickup latency (ms) of jobs started in [lo, hi)."""
        first, end = self._index(lo, hi)
        values = self.pickup_ms[first:end]
        return percentile(values, pct) if values else None

    def clean_rate(self) -> float:
        """Jobs/s over the clean phase; raises when none ran (nothing to compare with)."""
        rate = self.rate(*self.window("clean"))
        if rate <= 0:
            raise RuntimeError(f"snapshot {self.pressure}.{self.load}: no job ran while clean")
        return rate

    def intervals(self) -> list[tuple[float, float, Sample]]:
        """Each interval's nominal [start, end) and its closing sample."""
        iv = self.interval_s
        return [(k * iv, (k + 1) * iv, s) for k, s in enumerate(self.samples)]

    def recovery_s(self) -> float | None:
        """Seconds from the release to the end of the first recovery interval whose rate is
        back (BACK_WITHIN); None if none was."""
        clean = self.clean_rate()
        released = self.marks["recovery"]
        for lo, hi, s in self.intervals():
            if s.phase != "recovery":
                continue
            rate = self.rate(lo, hi)
            back = (
                rate >= (1 - BACK_WITHIN) * clean
                if self.load == "max"
                else abs(rate - clean) <= BACK_WITHIN * clean
            )
            if back:
                return hi - released
        return None

    def figures(self) -> dict[str, Figure]:
        """The figures, by key under ``snapshot.<pressure>.<load>.``."""
        clean = self.clean_rate()
        held = [(lo, hi) for lo, hi, s in self.intervals() if s.phase == "held"]
        recovered = self.recovery_s()
        rec_lo, rec_hi = self.window("recovery")
        probes = [s.probe_ms for s in self.samples if s.phase == "clean"]
        last = [s for s in self.samples if s.phase == "held"][-1]
        out: dict[str, Figure] = {
            "clean_rate": (clean, "jobs/s", True, "rate while clean"),
            "held_ratio": (self.rate(*self.window("held")) / clean, "x", True, "held / clean"),
            "held_last_ratio": (
                self.rate(*held[-1]) / clean,
                "x",
                True,
                "last held interval / clean",
            ),
            "recovery_s": (
                recovered if recovered is not None else rec_hi - rec_lo,
                "s",
                False,
                "release → rate back within 10% of clean (the whole window if never)",
            ),
            "dead_tuples_peak": (
                float(max(s.dead for s in self.samples)),
                "tuples",
                False,
                "dead tuples of job% tables, peak",
            ),
            "depth_peak": (
                float(max(s.depth for s in self.samples)),
                "jobs",
                False,
                "ready depth, peak",
            ),
            "probe_ms_clean": (statistics.median(probes), "ms", False, "claim scan, clean"),
            "probe_ms_held_last": (last.probe_ms, "ms", False, "claim scan, end of held"),
            "probe_pages_held_last": (
                float(last.probe_pages),
                "pages",
                False,
                "claim scan's buffers, end of held",
            ),
        }
        if self.load_rate is not None:
            out["load_rate"] = (self.load_rate, "jobs/s", True, "producer's rate")
            for phase in PHASES:
                lo, hi = self.window(phase)
                for pct in (50, 99):
                    got = self.pickup(lo, hi, pct)
                    if got is not None:
                        label = f"pickup p{pct} (enqueue commit → handler start), {phase}"
                        out[f"pickup_p{pct}_{phase}_ms"] = (got, "ms", False, label)
        return out

    def as_json(self) -> dict[str, Any]:
        """The series (one entry per interval) and the marks, for the results' notes."""
        series = []
        for lo, hi, s in self.intervals():
            p50, p99 = self.pickup(lo, hi, 50), self.pickup(lo, hi, 99)
            series.append(
                {
                    "t": round(hi, 3),
                    "phase": s.phase,
                    "rate": round(self.rate(lo, hi), 1),
                    "pickup_p50_ms": None if p50 is None else round(p50, 2),
                    "pickup_p99_ms": None if p99 is None else round(p99, 2),
                    "depth": s.depth,
                    "dead": s.dead,
                    "autovacuums": s.autovacuums,
                    "probe_ms": round(s.probe_ms, 3),
                    "probe_pages": s.probe_pages,
                }
            )
        peak = max(self.samples, key=lambda s: s.dead)
        return {
            "interval_s": self.interval_s,
            "marks": {k: round(v, 3) for k, v in self.marks.items()},
            "load_rate": self.load_rate,
            "jobs_started": len(self.starts),
            "dead_by_table_at_peak": peak.dead_by_table,
            "series": series,
        }
