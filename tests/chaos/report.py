"""Run the chaos suite and print (or update) the table of docs/reliability.md.

    python -m tests.chaos.report                  # CHAOS_SIZE (default quick), print the table
    CHAOS_SIZE=full python -m tests.chaos.report --update-doc    # what `make chaos` runs
    python -m tests.chaos.report --no-run --size quick            # table of the last quick run

The fault tests write one JSON file each to CHAOS_RESULTS (default
``$TMPDIR/brooq-chaos/<size>``); this script runs them (pytest), reads the
files, prints a Markdown table, and with ``--update-doc`` replaces the table
of that size in docs/reliability.md. The exit code is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
ORDER = [
    "kill9_children",
    "kill9_supervisor",
    "pg_restart",
    "terminate_backends",
    "two_hosts_one_killed",
    "handler_faults",
]
TITLES = {
    "kill9_children": "(a) `kill -9` of random children every 0.2–0.5 s",
    "kill9_supervisor": "(b) `kill -9` of the supervisor, then a new one",
    "pg_restart": "(c) PostgreSQL restart, then down 4.5 s",
    "terminate_backends": "(d) `pg_terminate_backend` of every connection ×4, refused 2 s",
    "two_hosts_one_killed": "(e) two supervisors, one `kill -9`",
    "handler_faults": "(f) handlers raise / hang / `SIGKILL` themselves / poison",
}


def results_dir(size: str) -> Path:
    """Where the fault tests of ``size`` write their numbers."""
    return Path(
        os.environ.get("CHAOS_RESULTS") or Path(tempfile.gettempdir()) / "brooq-chaos" / size
    )


def run_suite(size: str, directory: Path, pytest_args: list[str]) -> int:
    """Run the fault tests at ``size``; pytest's exit code."""
    if directory.exists():
        shutil.rmtree(directory)
    env = {**os.environ, "CHAOS_SIZE": size, "CHAOS_RESULTS": str(directory)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/chaos/test_faults.py",
        "-p",
        "no:cacheprovider",
        "-q",
        *pytest_args,
    ]
    print("$ CHAOS_SIZE=" + size + " " + " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def _faults(record: dict[str, Any]) -> str:
    f = record.get("faults", {})
    name = record["test"]
    if name == "kill9_children":
        return f"{f.get('child_kills')} child kills"
    if name == "kill9_supervisor":
        return (
            f"1 supervisor kill; the {f.get('rows_held_at_kill')} rows it held returned "
            f"{f.get('requeued_after_s')} s later"
        )
    if name == "pg_restart":
        return (
            f"1 restart ({f.get('restart_s')} s) + {f.get('pg_down_s')} s down; "
            f"/healthz 503 → 200 in {f.get('healthz_200_after_outage_s')} s"
        )
    if name == "terminate_backends":
        return (
            f"{f.get('backends_terminated')} backends terminated, "
            f"{f.get('connections_refused_s')} s refused; /healthz 503 → 200"
        )
    if name == "two_hosts_one_killed":
        return (
            f"1 of 2 supervisors killed; the {f.get('rows_held_at_kill')} rows it held "
            f"returned {f.get('requeued_after_s')} s later"
        )
    if name == "handler_faults":
        b = record.get("behaviours", {})
        return (
            f"{b.get('raise', 0)} raise, {f.get('hangs')} hang (killed ≤ "
            f"{f.get('hang_to_kill_max_s')} s), {f.get('self_kills')} self-kill, "
            f"{b.get('poison', 0)} poison"
        )
    return json.dumps(f)


def table(records: list[dict[str, Any]]) -> str:
    """The Markdown table of one run."""
    by_name = {r["test"]: r for r in records}
    names = [n for n in ORDER if n in by_name] + sorted(set(by_name) - set(ORDER))
    lines = [
        "| fault | jobs | faults injected | lost | duplicated in-DB effects | "
        "extra attempts | handler re-runs | time | result |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name in names:
        r = by_name[name]
        if r.get("problems"):
            result = f"FAIL ({r['problems']} violations)"
        else:
            result = "FAIL" if r.get("passed") is False else "pass"
        lines.append(
            f"| {TITLES.get(name, name)} | {r['jobs']:,} | {_faults(r)} | {r['lost']} | "
            f"{r['duplicated_effects']} | {r['extra_attempts']} | {r['reruns']} | "
            f"{r['runtime_s']:g} s | {result} |"
        )
    return "\n".join(lines)


def load(directory: Path) -> list[dict[str, Any]]:
    """Every results file of a run."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def update_doc(size: str, text: str) -> None:
    """Replace the table of ``size`` between its markers in docs/reliability.md."""
    begin, end = f"<!-- chaos:{size}:begin -->", f"<!-- chaos:{size}:end -->"
    doc = DOC.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{DOC}: markers {begin} … {end} not found")
    stamp = (
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores "
        f"({platform.machine()}, Python {platform.python_version()})."
    )
    block = f"{begin}\n{stamp}\n\n{text}\n{end}"
    DOC.write_text(
        re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    )
    print(f"updated {DOC.relative_to(ROOT)} ({size})")


def main(argv: list[str] | None = None) -> int:
    """Entry point; the exit code of the suite (0 with --no-run)."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.report")
    parser.add_argument(
        "--size",
        default=os.environ.get("CHAOS_SIZE") or "quick",
        help="quick (2,000 jobs per fault), full (20,000) or a number",
    )
    parser.add_argument("--no-run", action="store_true", help="only render the last results")
    parser.add_argument(
        "--update-doc", action="store_true", help="write the table into docs/reliability.md"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    directory = results_dir(args.size)
    code = 0 if args.no_run else run_suite(args.size, directory, args.pytest_args)
    records = load(directory)
    if not records:
        print(f"no results in {directory}", file=sys.stderr)
        return code or 1
    text = table(records)
    print(f"\nchaos results ({args.size}, {directory}):\n\n{text}\n")
    if args.update_doc and args.size in ("quick", "full"):
        update_doc(args.size, text)
    return code


if __name__ == "__main__":
    sys.exit(main())
