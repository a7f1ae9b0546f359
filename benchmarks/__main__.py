"""``python -m benchmarks``: brooq's benchmark suite (``make bench``). See benchmarks/README.md.

Rounds are interleaved: round 1 runs every selected benchmark once, then
round 2 runs them all again, and so on, so brooq and its raw reference share
whatever noise the machine has at that moment. The report gives each figure's
median and min–max over the rounds, and the brooq/raw ratios per round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import (
    claim_cost,
    cpu,
    cpubound,
    drain,
    enqueue,
    extras,
    fairness,
    idle,
    latency,
    middleware,
    partitions,
    peers,
    ratelimit,
    results_cost,
    retention,
    runs,
    snapshot,
    targets,
    workflows,
)
from benchmarks.harness import (
    FULL,
    QUICK,
    RESULTS_DIR,
    Context,
    Ratio,
    Results,
    Server,
    git_revision,
    machine,
    new_workdir,
    render,
    server_url,
    sizes_dict,
    write_results,
)

# name → one round of it. drain, raw, cpu and priorities share one runner so
# that brooq and raw at the same N sit next to each other in a round.
BENCHMARKS: dict[str, Callable[[Context, int], None]] = {
    "enqueue": enqueue.run_single,
    "bulk": enqueue.run_bulk,
    "drain": drain.run_round,
    "cpubound": cpubound.run_round,
    "idle": idle.run_round,
    "extras": extras.run_round,
    "middleware": middleware.run_round,
    "latency": latency.run_round,
    "claim_cost": claim_cost.run_round,
    "retention": retention.run_round,
    "results": results_cost.run_round,
    "partitions": partitions.run_round,
    "ratelimit": ratelimit.run_round,
    "workflows": workflows.run_round,
    "fairness": fairness.run_round,
    "snapshot": snapshot.run_round,
}
DRAIN_FAMILY = {"drain", "raw", "cpu", "priorities", "peers"}
NAMES = [
    "enqueue",
    "bulk",
    "drain",
    "raw",
    "cpu",
    "cpubound",
    "priorities",
    "idle",
    "extras",
    "middleware",
    "latency",
    "claim_cost",
    "retention",
    "results",
    "partitions",
    "ratelimit",
    "workflows",
    "fairness",
    "snapshot",
]
OFF_IN_QUICK = {"partitions", "workflows", "fairness"}
"""Too heavy for a smoke test: with --quick, run (a tiny variant) only when named in --only."""


def group_order(ctx: Context) -> list[str]:
    """The report's groups, in the order they are printed."""
    return [
        enqueue.GROUP_SINGLE,
        enqueue.GROUP_BULK,
        drain.GROUP,
        peers.GROUP,
        cpubound.group(ctx),
        runs.START_GROUP,
        cpu.PER_JOB_GROUP,
        drain.CONNECTIONS_GROUP,
        drain.PRIORITY_GROUP,
        cpu.GROUP,
        idle.group(ctx),
        extras.GROUP,
        middleware.GROUP,
        latency.GROUP,
        claim_cost.GROUP,
        retention.GROUP,
        results_cost.GROUP,
        partitions.GROUP,
        ratelimit.GROUP,
        workflows.GROUP,
        fairness.GROUP,
        snapshot.GROUP,
    ]


def ratios(sizes: Any, cpu_ms: float) -> list[Ratio]:
    """The ratios the report prints (each only when both sides were measured)."""
    out = [
        Ratio("enqueue one by one: brooq (NOTIFY on) / raw INSERT", "enqueue.brooq", "enqueue.raw"),
        Ratio(
            "enqueue one by one: brooq (NOTIFY off) / raw INSERT",
            "enqueue.brooq_nonotify",
            "enqueue.raw",
        ),
        Ratio(
            "enqueue one by one: NOTIFY on / NOTIFY off", "enqueue.brooq", "enqueue.brooq_nonotify"
        ),
        Ratio(
            "bulk enqueue: brooq enqueue_many / fastest raw", "bulk.brooq", enqueue.best_raw_bulk
        ),
    ]
    for n in sizes.drain_workers:
        out += [
            Ratio(
                f"drain N={n}: brooq / raw floor (claim + settle)",
                f"drain.brooq.N{n}",
                f"drain.raw_two.P{n}",
            ),
            Ratio(
                f"drain N={n}: brooq / raw fused (settle-and-claim)",
                f"drain.brooq.N{n}",
                f"drain.raw_fused.P{n}",
            ),
            Ratio(
                f"drain N={n}: supervisor's CPU per job / its workers'",
                f"cpujob.noop.brooq.N{n}.parent",
                f"cpujob.noop.brooq.N{n}.workers",
            ),
        ]
    top = sizes.max_workers
    out += [
        Ratio(
            f"drain N={top}: brooq / raw batched ceiling (10 per statement)",
            f"drain.brooq.N{top}",
            f"drain.raw_batch.P{top}",
        ),
        Ratio(
            f"drain N={top}: priorities 0..9 mixed / all priority 0",
            f"priority.mixed.N{top}",
            f"drain.brooq.N{top}",
        ),
    ]
    out += [
        Ratio(f"drain N={top}: brooq / {name}", f"drain.brooq.N{top}", f"peer.{name}.N{top}")
        for name in peers.PEERS
    ]
    out += cpubound_ratios(sizes, cpu_ms)
    top = sizes.max_workers
    out.append(
        Ratio(
            f"stored results: drain returning a 100-byte dict / returning None (N={top})",
            f"results.dict.N{top}",
            f"results.none.N{top}",
        )
    )
    out.append(
        Ratio(
            f"workflows: two-job chains / plain jobs, jobs/s (N={top})",
            f"workflows.chains.N{top}",
            f"workflows.plain.N{top}",
        )
    )
    out += [
        Ratio(
            f"per-job extras: {name} / a worker's CPU per job (no-op, N={top})",
            f"extras.{name}.us",
            "cpu.brooq.workers_cpu",
        )
        for name in ("logs_on", "logs_default", "metrics", "title", "default_total")
    ]
    out += [
        Ratio(
            f"middleware: {name} / a worker's CPU per job (no-op, N={top})",
            f"middleware.{name}.us",
            "cpu.brooq.workers_cpu",
        )
        for name in ("none", "one", "tracing")
    ]
    out += [
        Ratio(
            f"claim p99: {sizes.claim_rows:,} ready rows / {sizes.claim_baseline_rows:,}",
            f"claim.rows{sizes.claim_rows}.p99",
            f"claim.rows{sizes.claim_baseline_rows}.p99",
        ),
        Ratio(
            "concurrent claim p99: during retention / before",
            "retention.claim_p99_during",
            "retention.claim_p99_before",
        ),
    ]
    out += ratelimit.ratios(sizes)
    out += fairness.ratios(sizes)
    return out


def cpubound_ratios(sizes: Any, cpu_ms: float) -> list[Ratio]:
    """The CPU-bound drain's ratios: each system to the ideal, brooq to each other system."""
    ms = f"{cpu_ms:g} ms"
    out = []
    top = max(sizes.cpu_workers)
    systems = [(f"brooq N={n}", f"cpubound.brooq.N{n}") for n in sizes.cpu_workers]
    systems += [
        (f"raw {mode} P={n}", f"cpubound.raw_{mode}.P{n}")
        for n in sizes.cpu_workers
        for mode in cpubound.RAW_MODES
    ]
    systems += [(f"{name} N={top}", f"cpubound.{name}.N{top}") for name in peers.PEERS]
    out += [Ratio(f"cpu {ms}: {who} / ideal", key, "cpubound.ideal") for who, key in systems]
    for n in sizes.cpu_workers:
        mine = f"cpubound.brooq.N{n}"
        out += [
            Ratio(f"cpu {ms} N={n}: brooq / raw {mode}", mine, f"cpubound.raw_{mode}.P{n}")
            for mode in cpubound.RAW_MODES
        ]
        out.append(
            Ratio(
                f"cpu {ms} N={n}: supervisor's CPU per job / its workers'",
                f"cpujob.cpu.brooq.N{n}.parent",
                f"cpujob.cpu.brooq.N{n}.workers",
            )
        )
    out += [
        Ratio(
            f"cpu {ms} N={top}: brooq / {name}", f"cpubound.brooq.N{top}", f"cpubound.{name}.N{top}"
        )
        for name in peers.PEERS
    ]
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, one round by default: proves the harness runs (CI)",
    )
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these (repeatable or comma-separated): {', '.join(NAMES)}",
    )
    p.add_argument(
        "--peers",
        default="",
        metavar="NAMES",
        help=f"peer queues to measure too (comma-separated): {', '.join(peers.PEERS)}",
    )
    p.add_argument(
        "--cpu-ms",
        type=float,
        default=2.0,
        metavar="X",
        help="the CPU-bound workload: every handler spins X ms of its thread's CPU (default 2)",
    )
    p.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help="where <timestamp>.json goes (default benchmarks/results)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="after the rounds, one more drain at the largest N with py-spy on "
        "the supervisor and a child; raw stacks go to DIR",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the supervisors' log files")
    p.add_argument(
        "--snapshot-phases",
        default="",
        metavar="CLEAN,HELD,RECOVERY[,INTERVAL]",
        help="the held-snapshot run's phases and sampling interval in seconds "
        "(default 60,300,120,10; with --quick 0.2,0.4,0.2,0.1)",
    )
    p.add_argument(
        "--snapshot-workers",
        type=int,
        default=None,
        metavar="N",
        help="the held-snapshot run's workers (default 4)",
    )
    p.add_argument(
        "--snapshot-cells",
        default="",
        metavar="PRESSURE.LOAD,...",
        help="the held-snapshot cells to run, e.g. rr.max (default: every one of "
        f"{', '.join(snapshot.CELLS)}); a half cell runs its max cell first, for its rate",
    )
    args = p.parse_args(argv)
    try:
        args.snapshot_phases = tuple(float(x) for x in args.snapshot_phases.split(",") if x)
    except ValueError:
        p.error(f"--snapshot-phases takes numbers (got {args.snapshot_phases!r})")
    if len(args.snapshot_phases) > 4 or any(x <= 0 for x in args.snapshot_phases):
        p.error("--snapshot-phases: up to four positive numbers of seconds")
    args.snapshot_cells = tuple(c.strip() for c in args.snapshot_cells.split(",") if c.strip())
    strange = [c for c in args.snapshot_cells if c not in snapshot.CELLS]
    if strange:
        p.error(
            f"--snapshot-cells: no cell {', '.join(strange)}; "
            f"choose from {', '.join(snapshot.CELLS)}"
        )
    if args.snapshot_workers is not None and args.snapshot_workers < 1:
        p.error(f"--snapshot-workers must be at least 1 (got {args.snapshot_workers})")
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not 0 < args.cpu_ms <= 1000:
        p.error(f"--cpu-ms must be more than 0 and at most 1000 (got {args.cpu_ms:g})")
    selected = {n.strip() for item in args.only or [] for n in item.split(",") if n.strip()}
    unknown = selected - set(NAMES) - {"peers"}
    if unknown:
        p.error(
            f"unknown benchmark(s): {', '.join(sorted(unknown))}; choose from {', '.join(NAMES)}"
        )
    args.selected = selected or set(NAMES) - (OFF_IN_QUICK if args.quick else set())
    args.peer_names = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown_peers = set(args.peer_names) - set(peers.PEERS)
    if unknown_peers:
        p.error(
            f"unknown peer(s): {', '.join(sorted(unknown_peers))}; known: {', '.join(peers.PEERS)}"
        )
    if args.peer_names:
        args.selected.add("peers")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected benchmarks in interleaved rounds; print and write the results."""
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 3)
    results = Results()
    server = Server(server_url())
    workdir = new_workdir()
    ctx = Context(
        server=server,
        sizes=sizes,
        results=results,
        workdir=workdir,
        rounds=rounds,
        profile_dir=args.profile,
        peers=args.peer_names,
        selected=args.selected,
        cpu_ms=args.cpu_ms,
        results_dir=args.results_dir,
        snapshot_phases=args.snapshot_phases,
        snapshot_cells=args.snapshot_cells,
        snapshot_workers=args.snapshot_workers or 0,
    )
    meta: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": git_revision(),
        "quick": args.quick,
        "rounds": rounds,
        "selected": sorted(args.selected),
        "peers": args.peer_names,
        "cpu_ms": args.cpu_ms,
        "sizes": sizes_dict(sizes),
        "machine": machine(),
        "postgres": server.settings(),
    }
    if "snapshot" in args.selected:
        meta["snapshot_sizes"] = asdict(snapshot.sizes_for(ctx))
    if rounds < 3 and not args.quick:
        print("warning: fewer than 3 rounds; medians and ranges mean little", file=sys.stderr)
    began = time.monotonic()
    try:
        if "peers" in args.selected:
            peers.prepare(ctx)
        for round_no in range(rounds):
            print(f"round {round_no + 1}/{rounds}", file=sys.stderr, flush=True)
            for name, run in BENCHMARKS.items():
                wanted = (
                    bool(DRAIN_FAMILY & args.selected) if name == "drain" else name in args.selected
                )
                if wanted:
                    t0 = time.monotonic()
                    run(ctx, round_no)
                    print(f"  {name}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        if args.profile:
            print("profile run", file=sys.stderr, flush=True)
            drain.profile_run(ctx)
    finally:
        server.close()
        if not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"supervisor logs kept in {workdir}", file=sys.stderr)
    meta["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["duration_s"] = round(time.monotonic() - began, 1)
    computed = [r for ratio in ratios(sizes, args.cpu_ms) if (r := results.ratio(ratio))]
    meta["targets"] = targets.evaluate(results, sizes, args.cpu_ms)
    path = write_results(results, meta, computed, args.results_dir)
    print(render(results, meta, computed, group_order(ctx)))
    print("\n" + targets.render(meta["targets"]))
    print(f"\nresults: {path}")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
