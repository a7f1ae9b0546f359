"""The held-snapshot run as a PNG (matplotlib, no display needed): rate, pickup latency,
dead tuples and depth, the claim's scan, over time, with the phases shaded."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from benchmarks.snapshot_series import PHASES, Run

SHADE = {"clean": None, "held": "#f4c7c3", "recovery": "#d9ead3"}
PRESSURE_WORDS = {
    "rr": "REPEATABLE READ snapshot held",
    "idle_xid": "idle in transaction with an XID",
}


def _phases(ax: Axes, run: Run, *, label: bool = False) -> None:
    """Shade the held and recovery spans (from the moments the pressure opened and closed)."""
    for phase in PHASES:
        color = SHADE[phase]
        if color and phase in run.marks:
            lo, hi = run.window(phase)
            ax.axvspan(lo, hi, color=color, alpha=0.6, lw=0, label=phase if label else None)


def draw(run: Run, path: Path) -> None:
    """Write ``path``: panels sharing the time axis (seconds from the start): the rate, the
    pickup latency (half load only: at max every job waits behind the kept backlog), dead
    tuples and depth, the claim's scan."""
    half = run.load_rate is not None
    fig = Figure(figsize=(10, 11 if half else 8.5), layout="constrained")
    axes = list(fig.subplots(4 if half else 3, 1, sharex=True))
    rate_ax, pickup_ax = axes[0], axes[1] if half else None
    dead_ax, probe_ax = axes[-2], axes[-1]
    load = f"half load ({run.load_rate:,.0f}/s)" if half else "max drain (backlog kept)"
    fig.suptitle(f"brooq, {PRESSURE_WORDS[run.pressure]}: {load}, {run.interval_s:g} s intervals")
    spans = run.intervals()
    mids = [(lo + hi) / 2 for lo, hi, _ in spans]
    ends = [s.at for _, _, s in spans]

    _phases(rate_ax, run, label=True)
    rate_ax.plot(mids, [run.rate(lo, hi) for lo, hi, _ in spans], "o-", color="#1f4e79", ms=3)
    clean = run.clean_rate()
    rate_ax.axhline(clean, ls="--", color="grey", lw=1, label=f"clean {clean:,.0f}/s")
    rate_ax.axhline(0.9 * clean, ls=":", color="grey", lw=1, label="90% of clean")
    rate_ax.set_ylabel("jobs started / s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.legend(loc="lower left", fontsize="small")

    if pickup_ax is not None:
        _phases(pickup_ax, run)
        for pct, style in ((50, "o-"), (99, "s-")):
            values = [run.pickup(lo, hi, pct) for lo, hi, _ in spans]
            points = [(t, v) for t, v in zip(mids, values, strict=True) if v is not None]
            pickup_ax.plot(*zip(*points, strict=True), style, ms=3, label=f"p{pct}")
        pickup_ax.set_yscale("log")
        pickup_ax.legend(loc="upper left", fontsize="small")
        pickup_ax.set_ylabel("pickup (ms)\nenqueue commit → start")

    _phases(dead_ax, run)
    dead_ax.plot(ends, [s.dead for _, _, s in spans], "o-", color="#a61c00", ms=3)
    # An autovacuum that finished in an interval: under the pressure it removes nothing.
    ran = [
        s.at
        for prev, s in zip(run.samples, run.samples[1:], strict=False)
        if s.autovacuums > prev.autovacuums
    ]
    for at in ran:
        dead_ax.axvline(at, ls=":", color="#a61c00", lw=1)
    dead_ax.set_ylabel("dead tuples (job%)\n(dotted: an autovacuum ended)", color="#a61c00")
    dead_ax.set_ylim(bottom=0)
    depth_ax = dead_ax.twinx()
    depth_ax.plot(ends, [s.depth for _, _, s in spans], "^-", color="#38761d", ms=3)
    depth_ax.set_ylabel("ready depth (jobs)", color="#38761d")
    depth_ax.set_ylim(bottom=0)

    _phases(probe_ax, run)
    probe_ax.plot(ends, [s.probe_ms for _, _, s in spans], "o-", color="#674ea7", ms=3)
    probe_ax.set_ylabel("claim scan (ms)", color="#674ea7")
    probe_ax.set_ylim(bottom=0)
    pages_ax = probe_ax.twinx()
    pages_ax.plot(ends, [s.probe_pages for _, _, s in spans], ".--", color="#b45f06", ms=3)
    pages_ax.set_ylabel("its buffers (pages)", color="#b45f06")
    pages_ax.set_ylim(bottom=0)
    probe_ax.set_xlabel(
        "seconds from the start (shaded: held, then recovery); "
        "rate and pickup per interval, the rest sampled at its end"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
