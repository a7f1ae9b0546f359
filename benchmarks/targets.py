"""The report's "Issue 21 targets": each target with its measured value and met / not met.

A target is a ratio of two figures (computed per round, like every ratio:
the pair ran side by side) or a figure; its value is the median over the
rounds, and the verdict compares that median with the target. A target whose
figures were not measured (a peer not run, ``--only``) says so. The targets
are the issue's, never asserted anywhere: they are read from one run.
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import enqueue
from benchmarks.harness import Ratio, Results, Sizes, fmt

TITLE = "Issue 21 targets"
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
SHOWN = {">": ">", ">=": "≥", "<": "<", "<=": "≤"}


@dataclass(frozen=True)
class Target:
    """``measure`` (a Ratio, or a figure key) compared with ``threshold``."""

    label: str
    measure: Ratio | str
    op: str
    threshold: float
    unit: str = "×"
    also: bool = False
    """Asked by the issue's "Must deliver" rather than its Targets."""


def targets(sizes: Sizes, cpu_ms: float) -> list[Target]:
    """The issue's targets at this run's sizes."""
    top = sizes.max_workers
    small = min(sizes.drain_workers)
    c = max(sizes.cpu_workers)
    cpu = f"{cpu_ms:g} ms CPU-bound drain, {c} workers"
    return [
        Target(
            f"no-op drain, {top} workers: brooq / pgqueuer's best",
            Ratio("", f"drain.brooq.N{top}", f"peer.pgqueuer.N{top}"),
            ">",
            1.0,
        ),
        Target(
            f"no-op drain, {top} workers: brooq / raw batched ceiling",
            Ratio("", f"drain.brooq.N{top}", f"drain.raw_batch.P{top}"),
            ">=",
            0.5,
        ),
        Target(
            f"no-op drain, {small} workers: brooq / raw two-commit loop at {small} processes",
            Ratio("", f"drain.brooq.N{small}", f"drain.raw_two.P{small}"),
            ">",
            1.0,
        ),
        Target(
            f"{cpu}: brooq / pgqueuer's best ({c} processes)",
            Ratio("", f"cpubound.brooq.N{c}", f"cpubound.pgqueuer.N{c}"),
            ">",
            1.0,
        ),
        Target(
            f"{cpu}: brooq / raw two-commit loop ({c} processes)",
            Ratio("", f"cpubound.brooq.N{c}", f"cpubound.raw_two.P{c}"),
            ">",
            1.0,
        ),
        Target(
            f"{cpu}: brooq / ideal",
            Ratio("", f"cpubound.brooq.N{c}", "cpubound.ideal"),
            ">=",
            0.75,
        ),
        Target(
            f"{cpu}: brooq's CPU per job outside the handler",
            f"cpujob.cpu.brooq.N{c}.outside",
            "<=",
            0.25,
            "ms",
        ),
        Target("idle latency p50 (NOTIFY on)", "latency.notify_on.p50", "<=", 2.0, "ms"),
        Target("idle latency p99 (NOTIFY on)", "latency.notify_on.p99", "<=", 10.0, "ms"),
        Target(
            "bulk enqueue: brooq / fastest raw bulk insert",
            Ratio("", "bulk.brooq", enqueue.best_raw_bulk),
            ">=",
            0.9,
        ),
        Target(
            "single enqueue: brooq / raw INSERT",
            Ratio("", "enqueue.brooq", "enqueue.raw"),
            ">=",
            0.8,
        ),
        Target(
            f"idle supervisor, {sizes.idle_workers} workers (parent + workers)",
            "idle.supervisor_pct",
            "<",
            1.0,
            "% of a core",
        ),
        Target(
            "per-job log lines (default), metrics, title / a worker's CPU per job (no-op)",
            Ratio("", "extras.default_total.us", "cpu.brooq.workers_cpu"),
            "<=",
            0.10,
            also=True,
        ),
        Target(
            "no middleware registered: per-job checks / a worker's CPU per job (no-op)",
            Ratio("", "middleware.none.us", "cpu.brooq.workers_cpu"),
            "<=",
            0.01,
            also=True,
        ),
        Target(
            f"no-op drain, {top} workers: supervisor's CPU per job / its workers'",
            Ratio("", f"cpujob.noop.brooq.N{top}.parent", f"cpujob.noop.brooq.N{top}.workers"),
            "<",
            1.0,
            also=True,
        ),
    ]


def _value(results: Results, measure: Ratio | str) -> dict[str, Any] | None:
    if isinstance(measure, Ratio):
        return results.ratio(measure)
    fig = results.figures.get(measure)
    if fig is None or not fig.values:
        return None
    return {
        "median": statistics.median(fig.values),
        "min": min(fig.values),
        "max": max(fig.values),
        "values": fig.values,
    }


def evaluate(results: Results, sizes: Sizes, cpu_ms: float) -> list[dict[str, Any]]:
    """Every target with its value (median, min, max) and ``met`` (None: not measured)."""
    out = []
    for t in targets(sizes, cpu_ms):
        got = _value(results, t.measure)
        if isinstance(t.measure, Ratio):
            what = f"{got['numerator']} / {got['denominator']}" if got else t.measure.numerator
        else:
            what = t.measure
        out.append(
            {
                "label": t.label,
                "measure": what,
                "target": f"{SHOWN[t.op]} {t.threshold:g}",
                "unit": t.unit,
                "also": t.also,
                "median": round(got["median"], 4) if got else None,
                "min": round(got["min"], 4) if got else None,
                "max": round(got["max"], 4) if got else None,
                "met": OPS[t.op](got["median"], t.threshold) if got else None,
            }
        )
    return out


def render(evaluated: list[dict[str, Any]]) -> str:
    """The report's section: one line per target."""
    width = max(len(e["label"]) for e in evaluated)
    lines = [f"{TITLE} (median over the rounds, min – max; a ratio is per round)"]
    for also in (False, True):
        if also:
            lines.append("  also asked by the issue (Must deliver):")
        for e in (e for e in evaluated if e["also"] == also):
            if e["met"] is None:
                value, verdict = "-", "not measured"
            else:
                value = f"{fmt(e['median'])} ({fmt(e['min'])} – {fmt(e['max'])})"
                verdict = "met" if e["met"] else "NOT MET"
            lines.append(
                f"  {e['label']:<{width}}  {value:>22} {e['unit']:<11} "
                f"target {e['target']:<6} {verdict}"
            )
    return "\n".join(lines)
