"""The benchmark harness's own parts, without a database: what they count and how they judge.

The harness runs end to end in tests/system/test_bench_quick.py; here are the
parts whose mistakes would not show there: CPU read per thread (a process's
own schedstat is its main thread only), a drain whose clock started late is
void, the profile's categories, and the targets' verdicts.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from benchmarks import cpu, peers, profile, redis_server, runs, targets
from benchmarks.__main__ import parse_args
from benchmarks.apps import spin
from benchmarks.harness import QUICK, Context, Results


def _ctx(results: Results) -> Context:
    return Context(
        server=None,  # type: ignore[arg-type]
        sizes=QUICK,
        results=results,
        workdir=Path("/nonexistent"),
        rounds=1,
    )


def test_a_process_cpu_counts_every_thread_not_only_the_main_one() -> None:
    pid = os.getpid()
    before_main = Path(f"/proc/{pid}/schedstat").read_text().split()[0]
    before = cpu.threads(pid)
    assert before is not None
    spun, release = threading.Event(), threading.Event()

    def burn() -> None:
        spin(60)
        spun.set()
        release.wait(10)

    thread = threading.Thread(target=burn)
    thread.start()
    try:
        assert spun.wait(10)
        after = cpu.threads(pid)
        assert after is not None
        on_cpu, _ = cpu.spent(before, after)
        main_only = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) - int(before_main)
        assert on_cpu >= 0.06
        assert main_only / 1e9 < 0.06  # what reading /proc/<pid>/schedstat alone would miss
    finally:
        release.set()
        thread.join(10)


def test_spent_takes_each_thread_delta_a_new_thread_whole_and_never_a_negative() -> None:
    before = {1: (1.0, 0.5), 2: (5.0, 1.0)}  # thread 2 ends in between
    after = {1: (1.25, 0.75), 3: (0.5, 0.25)}  # thread 3 starts in between
    assert cpu.spent(before, after) == (0.75, 0.5)


def test_a_drain_with_jobs_done_before_its_clock_is_recorded_and_void() -> None:
    results = Results()
    ctx = _ctx(results)
    with pytest.raises(runs.EarlyStart, match="3 of 100 jobs were done before the clock"):
        runs.record_drain(
            ctx, 0, "drain.x.N2", group="g", label="x", jobs=100, seconds=1.0, done_at_start=3
        )
    assert results.figures["start.drain.x.N2"].values == [3]
    assert "drain.x.N2" not in results.figures

    runs.record_drain(
        ctx, 0, "drain.y.N2", group="g", label="y", jobs=100, seconds=0.5, done_at_start=0
    )
    assert results.figures["start.drain.y.N2"].values == [0]
    assert results.figures["drain.y.N2"].values == [200.0]


WORKER_ABOVE = (
    "Supervisor.run (brooq/supervisor/arbiter.py:93);Supervisor.tick (brooq/supervisor/arbiter."
    "py:173);Processes.spawn (brooq/supervisor/processes.py:84);worker_main (brooq/supervisor/"
    "child.py:349);Worker.run (brooq/supervisor/child.py:172)"
)


def _frames(stack: str) -> list[str]:
    return stack.split(";")[::-1]


def test_a_worker_sample_is_placed_by_its_own_frames_not_the_parent_tick_that_forked_it() -> None:
    idle = _frames(WORKER_ABOVE + ";Worker.wait_for_jobs (brooq/supervisor/child.py:183)")
    assert profile.worker_category(idle).startswith("waiting for its next job")
    fds = _frames(
        WORKER_ABOVE + ";Worker.execute (brooq/supervisor/child.py:241);Worker.check_fds "
        "(brooq/supervisor/child.py:293);fd_identities (brooq/osproc.py:138)"
    )
    assert profile.worker_category(fds) == "descriptor checks around the handler"
    title = _frames(WORKER_ABOVE + ";Worker.execute (x);title (brooq/osproc.py:157)")
    assert profile.worker_category(title) == "process title (setproctitle)"


def test_a_supervisor_sample_names_its_thread_or_the_step_of_its_loop() -> None:
    step = _frames(
        "Supervisor.run (a);Supervisor.tick (b);Supervisor.dispatch (c);Dispatcher.top_up (d)"
    )
    assert profile.parent_category(step) == "loop: Supervisor.dispatch"
    lane = _frames(
        "Thread._bootstrap (t);DatabaseThread._serve (brooq/supervisor/database.py:165);"
        "Connection.wait (psycopg/connection.py:495)"
    )
    assert profile.parent_category(lane) == "database lanes (threads): waiting on PostgreSQL"


def test_targets_say_met_not_met_and_not_measured_from_the_medians() -> None:
    results = Results()
    for r, (brooq, raw) in enumerate([(1100, 1000), (900, 1000), (1200, 1000)]):
        results.add("drain.brooq.N2", brooq, round_no=r, group="g", label="b", unit="jobs/s")
        results.add("drain.raw_two.P2", raw, round_no=r, group="g", label="r", unit="jobs/s")
    for r, ms in enumerate([1.5, 2.5, 2.2]):
        results.add("latency.notify_on.p50", ms, round_no=r, group="g", label="l", unit="ms")
    got = {t["label"]: t for t in targets.evaluate(results, QUICK, 2.0)}
    two = got["no-op drain, 2 workers: brooq / raw two-commit loop at 2 processes"]
    assert (two["median"], two["min"], two["max"], two["met"]) == (1.1, 0.9, 1.2, True)
    p50 = got["idle latency p50 (NOTIFY on)"]
    assert (p50["median"], p50["met"]) == (2.2, False)
    assert got["no-op drain, 2 workers: brooq / pgqueuer's best"]["met"] is None
    text = targets.render(list(got.values()))
    assert text.startswith("Issue 21 targets")
    assert "NOT MET" in text and "not measured" in text


def test_cpu_ms_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--cpu-ms", "5"]).cpu_ms == 5.0
    with pytest.raises(SystemExit) as exited:
        parse_args(["--cpu-ms", "0"])
    assert exited.value.code == 2
    assert "--cpu-ms must be more than 0" in capsys.readouterr().err


def test_snapshot_cells_are_named_pressure_dot_load(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([]).snapshot_cells == ()
    assert parse_args(["--snapshot-cells", "rr.max, idle_xid.half"]).snapshot_cells == (
        "rr.max",
        "idle_xid.half",
    )
    with pytest.raises(SystemExit) as exited:
        parse_args(["--snapshot-cells", "rr.fast"])
    assert exited.value.code == 2
    assert "no cell rr.fast; choose from rr.max, rr.half" in capsys.readouterr().err
    assert parse_args(["--snapshot-workers", "8"]).snapshot_workers == 8
    for bad in ("-1", "0"):
        with pytest.raises(SystemExit):
            parse_args(["--snapshot-workers", bad])
        assert "--snapshot-workers must be at least 1" in capsys.readouterr().err


def test_the_spin_spends_its_own_thread_cpu() -> None:
    started = time.thread_time()
    spin(5)
    assert time.thread_time() - started >= 0.005


def test_a_peer_that_cannot_be_installed_is_dropped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_redis() -> str:
        raise RuntimeError("apt-get install -y redis-server failed: no network")

    monkeypatch.setattr(peers, "_install", lambda name: "5.7.0")
    monkeypatch.setattr(redis_server, "ensure_installed", no_redis)
    results = Results()
    ctx = _ctx(results)
    ctx.peers = ["celery"]
    peers.prepare(ctx)
    assert ctx.peers == []
    assert results.notes["peer celery"].startswith("skipped: could not install: apt-get install")
    assert "celery is skipped" in capsys.readouterr().err


def test_redis_is_installed_only_by_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_server, "executable", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="only root may apt-get install it"):
        redis_server.ensure_installed()
