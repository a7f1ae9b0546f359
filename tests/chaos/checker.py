"""The ledger's checker: after a chaos run, does every promise still hold for every job?

It reads the ``job`` rows, the ``effect`` rows (written in the settle
transaction) and the side log (written outside it, at least once), and
returns a :class:`Verdict`: the measured numbers (lost jobs, duplicated
in-database effects, extra attempts, handler re-runs) and one line per
broken invariant naming the job, its state, attempts, effect count and
side-log entries.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tests.chaos.apps import ledger

MISBEHAVIOURS = ("raise", "hang", "selfkill")
EFFECT_TABLE = "CREATE TABLE IF NOT EXISTS effect (job_id uuid PRIMARY KEY)"
CRASH_ERRORS = ("worker process", "attempt timed out", "AttemptTimedOut", "max_execution")


class Executes(Protocol):
    """A connection, or anything that runs a statement like one."""

    def execute(self, query: Any, params: Any = ...) -> Any:
        """Run ``query``; a cursor."""
        ...


@dataclass(frozen=True)
class Side:
    """One side-log line."""

    attempt: int
    pid: int
    event: str
    ts: float


@dataclass
class Plan:
    """What was enqueued: job id → behaviour, and how many first attempts misbehave."""

    behaviour: dict[str, str] = field(default_factory=dict)
    times: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """How many jobs were enqueued."""
        return len(self.behaviour)

    def count(self, behaviour: str) -> int:
        """How many jobs have ``behaviour``."""
        return sum(1 for b in self.behaviour.values() if b == behaviour)


@dataclass
class Verdict:
    """The measured outcome of one run, and every invariant a job broke."""

    jobs: int = 0
    done: int = 0
    dead: int = 0
    lost: int = 0
    duplicated_effects: int = 0
    missing_effects: int = 0
    extra_attempts: int = 0
    claims_without_run: int = 0
    """Attempts charged with no handler start in the side log (lost with a process)."""
    reruns: int = 0
    """Handler runs beyond the planned ones (at-least-once execution at work)."""
    repeated_successes: int = 0
    """Handler runs that returned ok beyond the first, per job (side effects done twice)."""
    problems: list[str] = field(default_factory=list)

    def numbers(self) -> dict[str, int]:
        """The counters, for the results file."""
        out = asdict(self)
        out.pop("problems")
        return out

    def report(self, limit: int = 40) -> str:
        """The problems, one line each (at most ``limit``), and the numbers."""
        lines = [f"{len(self.problems)} invariant violations; numbers: {self.numbers()}"]
        lines += self.problems[:limit]
        if len(self.problems) > limit:
            lines.append(f"... and {len(self.problems) - limit} more")
        return "\n".join(lines)


def create_tables(conn: Executes) -> None:
    """The effect table the handler writes in its settle transaction."""
    conn.execute(EFFECT_TABLE)


def enqueue_mix(
    conn: Executes, total: int, mix: dict[str, float], seed: int = 7, max_ms: int = 4
) -> Plan:
    """Enqueue ``total`` jobs; ``mix`` gives the share of each non-normal behaviour.

    Behaviours are shuffled so faulty jobs are spread through the run; normal
    jobs sleep 0..``max_ms`` ms, so kills land inside handlers as well as
    between them.
    """
    rng = random.Random(seed)
    kinds: list[str] = []
    for behaviour, share in mix.items():
        kinds += [behaviour] * round(total * share)
    kinds += ["normal"] * (total - len(kinds))
    rng.shuffle(kinds)
    plan = Plan()
    topics, payloads = [], []
    for seq, behaviour in enumerate(kinds):
        payloads.append(json.dumps({"do": behaviour, "ms": rng.randint(0, max_ms), "seq": seq}))
        topics.append(ledger.POISON_TOPIC if behaviour == "poison" else ledger.TOPIC)
    for start in range(0, total, 5000):
        # One statement per chunk, in order: same available_at, UUIDv7 ids in
        # enqueue order, so the poison topic interleaves with the others.
        rows = conn.execute(
            "INSERT INTO job (topic, payload) SELECT t, p FROM unnest(%s::text[], %s::jsonb[]) "
            "WITH ORDINALITY AS x(t, p, n) ORDER BY n RETURNING id, (payload->>'seq')::int",
            (topics[start : start + 5000], payloads[start : start + 5000]),
        ).fetchall()
        for job_id, seq in rows:
            plan.behaviour[str(job_id)] = kinds[seq]
            plan.times[str(job_id)] = 1
    for topic in (ledger.TOPIC, ledger.POISON_TOPIC):
        conn.execute("SELECT pg_notify('brooq_job', %s)", (topic,))
    return plan


def read_side_log(directory: Path) -> dict[str, list[Side]]:
    """Every side-log line, per job id, in file order."""
    out: dict[str, list[Side]] = defaultdict(list)
    for path in sorted(directory.glob("side-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue  # a line cut by a kill mid-write cannot happen (one write) but be safe
            job_id, attempt, pid, event, ts = parts
            out[job_id].append(Side(int(attempt), int(pid), event, float(ts)))
    return out


def unfinished(conn: Executes) -> int:
    """Rows not yet terminal."""
    row = conn.execute(
        "SELECT count(*) FROM job WHERE state IN ('pending', 'processing', 'failed')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def check(
    conn: Executes, plan: Plan, side_dir: Path, *, strict: bool = False, lease_faults: bool = False
) -> Verdict:
    """Check every job of ``plan`` against the promises; the verdict.

    ``strict``: the run had only handler-level faults, so every charged
    attempt must have started a handler and a success must never be lost.
    ``lease_faults``: whole supervisors or the database went away, so leases
    expired and the reaper may have pushed a job past max_attempts.
    """
    rows = {
        str(r[0]): r[1:]
        for r in conn.execute(
            "SELECT id, state, attempts, last_error, locked_by, expirations FROM job"
        )
    }
    effects = Counter(str(r[0]) for r in conn.execute("SELECT job_id FROM effect"))
    side = read_side_log(side_dir)
    v = Verdict(jobs=plan.total)
    for job_id, behaviour in plan.behaviour.items():
        entries = side.get(job_id, [])
        row = rows.get(job_id)
        problems = _check_job(
            job_id,
            behaviour,
            plan.times[job_id],
            row,
            effects[job_id],
            entries,
            v,
            strict=strict,
            lease_faults=lease_faults,
        )
        for problem in problems:
            state, attempts = (row[0], row[1]) if row else ("(no row)", "-")
            shown = [f"a{s.attempt}:{s.event}@{s.pid}" for s in entries]
            v.problems.append(
                f"job {job_id} [{behaviour}] {problem}: state={state} attempts={attempts} "
                f"effects={effects[job_id]} side={shown} "
                f"last_error={(row[2] if row else None)!r}"
            )
    for job_id in set(rows) - set(plan.behaviour):
        v.problems.append(f"job {job_id}: a row nobody enqueued (state={rows[job_id][0]})")
    for job_id, n in effects.items():
        if job_id not in plan.behaviour:
            v.problems.append(f"effect row for job {job_id} that was never enqueued ({n})")
    return v


def _check_job(
    job_id: str,
    behaviour: str,
    times: int,
    row: tuple[Any, ...] | None,
    effects: int,
    entries: list[Side],
    v: Verdict,
    *,
    strict: bool,
    lease_faults: bool,
) -> list[str]:
    if row is None:
        v.lost += 1
        return ["LOST: the row is gone"]
    state, attempts, last_error, _, expirations = row
    # The attempt a handler sees, and max_attempts bounds, is the charged one: a lease
    # expiry (the host or supervisor died) takes an attempt but is not charged.
    charged = attempts - expirations
    out: list[str] = []
    starts = {s.attempt for s in entries if s.event == "start"}
    oks = {s.attempt for s in entries if s.event == "ok"}
    v.repeated_successes += max(0, sum(1 for s in entries if s.event == "ok") - 1)
    wanted = "dead" if behaviour == "poison" else "done"
    if state == "processing":
        out.append("STUCK: still processing after the run")
    elif state != wanted:
        out.append(f"WRONG STATE: expected {wanted}")
    if state in ("pending", "processing", "failed") or state != wanted:
        v.lost += 1
    v.done += state == "done"
    v.dead += state == "dead"
    expected_effects = 1 if state == "done" else 0
    if effects > expected_effects or "effect_pkey" in (last_error or ""):
        v.duplicated_effects += 1
        out.append("DUPLICATED EFFECT: the effect was written (or tried) twice")
    elif effects < expected_effects:
        v.missing_effects += 1
        out.append("MISSING EFFECT: done without its settle-transaction row")
    if attempts < 1:
        out.append("ATTEMPTS: a finished job with no attempt charged")
        return out
    max_attempts = ledger.POISON_MAX_ATTEMPTS if behaviour == "poison" else ledger.MAX_ATTEMPTS
    planned = (
        max_attempts if behaviour == "poison" else (times + 1 if behaviour in MISBEHAVIOURS else 1)
    )
    v.reruns += max(0, sum(1 for s in entries if s.event == "start") - planned)
    if charged > max_attempts:
        out.append(f"ATTEMPTS: {charged} charged, above max_attempts={max_attempts}")
    if expirations and not lease_faults:
        out.append(f"EXPIRATIONS: {expirations} lease expiries without any lease fault")
    if state == "done":
        v.extra_attempts += attempts - planned
        if charged < planned:
            out.append(
                f"ATTEMPTS: done after {charged} attempts, but the first {times} always fail"
            )
        if charged not in starts or charged not in oks:
            out.append(
                "UNEXPLAINED DONE: no side-log start+ok for the attempt that was recorded done"
            )
    elif state == "dead":
        v.extra_attempts += max(0, attempts - max_attempts)
        if charged < max_attempts and "lease expired" not in (last_error or ""):
            out.append(f"DEAD TOO EARLY: dead after {charged} < max_attempts={max_attempts}")
        error = last_error or ""
        if "ledger: poison" not in error and not any(c in error for c in CRASH_ERRORS):
            out.append("DEAD WITHOUT A RECORDED FAILURE of the last attempt")
    runless = [a for a in range(1, charged + 1) if a not in starts]
    v.claims_without_run += len(runless)
    if strict:
        if runless:
            out.append(
                f"UNEXPLAINED ATTEMPTS: attempts {runless} were charged but no handler "
                "started (only handler faults were injected)"
            )
        faulted = {s.attempt for s in entries if s.event in (*MISBEHAVIOURS, "poison")}
        final = charged if state == "done" else charged + 1
        retried = sorted(a for a in range(1, final) if a in starts and a not in faulted)
        if retried:
            out.append(
                f"UNEXPLAINED RETRY: attempts {retried} started, did not misbehave, and "
                "were not recorded done (only handler faults were injected)"
            )
        lost_ok = sorted(a for a in oks if a != charged or state != "done")
        if lost_ok:
            out.append(
                f"LOST SUCCESS: attempts {lost_ok} returned ok but were not recorded "
                "done (only handler faults were injected)"
            )
    return out


def write_results(path: Path, record: dict[str, Any]) -> None:
    """Write one run's measured numbers as JSON (the report script gathers these)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
