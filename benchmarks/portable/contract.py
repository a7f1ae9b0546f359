"""The long-horizon adapter contract of hardbyte/postgresql-job-queue-benchmarking.

Shared by this folder's adapters (brooq-bench, pgqueuer-bench); stdlib only, so
each adapter's venv needs nothing more. The contract (the harness's
CONTRIBUTING_ADAPTERS.md): the settings come in as environment variables, one
JSON record per line goes out on stdout (a descriptor at startup, then samples
every ``SAMPLE_EVERY_S`` on clock-aligned ticks), logs go to stderr; pickup
percentiles over a rolling 30 s window in bounded memory; a fixed-rate producer
credits its offered load on real elapsed time, or takes ``ENQUEUE <n>`` tokens
from the harness on stdin (``PRODUCER_PACING=harness``, the harness's default).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

PICKUP_WINDOW_S = 30.0
"""The window of the claim_p*_ms percentiles, as the contract says."""

# The metrics that describe the queue as a whole: only replica 0 emits them, so a
# run with --replicas N reports one observation, not N (as the harness's adapters do).
OBSERVER_METRICS = frozenset({"queue_depth", "running_depth", "producer_target_rate"})


class ContractError(ValueError):
    """An environment variable of the contract has a value the adapter cannot use."""


def _int(env: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise ContractError(f"{key}={raw!r}: not a number") from None
    if value < minimum:
        raise ContractError(f"{key}={raw!r}: must be at least {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    """What the harness tells an adapter through its environment."""

    database_url: str
    producer_mode: str = "fixed"
    producer_rate: int = 800
    pacing: str = "harness"
    batch_max: int = 128
    batch_ms: int = 25
    target_depth: int = 1000
    worker_count: int = 32
    payload_bytes: int = 256
    work_ms: int = 1
    sample_every_s: int = 5
    instance_id: int = 0
    rate_control_file: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read the contract's variables; ContractError names the first bad one."""
        url = env.get("DATABASE_URL", "").strip()
        if not url:
            raise ContractError("DATABASE_URL is not set: the harness sets it to the system's db")
        mode = env.get("PRODUCER_MODE", "fixed").strip() or "fixed"
        if mode not in ("fixed", "depth-target"):
            raise ContractError(f"PRODUCER_MODE={mode!r}: must be fixed or depth-target")
        pacing = env.get("PRODUCER_PACING", "harness").strip() or "harness"
        if pacing not in ("harness", "adapter"):
            raise ContractError(f"PRODUCER_PACING={pacing!r}: must be harness or adapter")
        return cls(
            database_url=url,
            producer_mode=mode,
            producer_rate=_int(env, "PRODUCER_RATE", 800, 0),
            pacing=pacing,
            batch_max=_int(env, "PRODUCER_BATCH_MAX", 128, 1),
            batch_ms=_int(env, "PRODUCER_BATCH_MS", 25, 1),
            target_depth=_int(env, "TARGET_DEPTH", 1000, 1),
            worker_count=_int(env, "WORKER_COUNT", 32, 1),
            payload_bytes=_int(env, "JOB_PAYLOAD_BYTES", 256, 0),
            work_ms=_int(env, "JOB_WORK_MS", 1, 0),
            sample_every_s=_int(env, "SAMPLE_EVERY_S", 5, 1),
            instance_id=_int(env, "BENCH_INSTANCE_ID", 0, 0),
            rate_control_file=env.get("PRODUCER_RATE_CONTROL_FILE", "").strip(),
        )

    @property
    def harness_paced(self) -> bool:
        """Whether the producer takes ENQUEUE tokens from stdin instead of pacing itself."""
        return self.pacing == "harness" and self.producer_mode == "fixed"

    @property
    def observer(self) -> bool:
        """Whether this replica emits the queue-wide metrics (OBSERVER_METRICS)."""
        return self.instance_id == 0

    @property
    def db_name(self) -> str:
        """The database named by DATABASE_URL (without its query string)."""
        from urllib.parse import urlparse

        return urlparse(self.database_url).path.lstrip("/") or ""

    def current_rate(self) -> int:
        """The offered rate now: the harness rewrites its control file in high-load phases."""
        if not self.rate_control_file:
            return self.producer_rate
        try:
            with open(self.rate_control_file) as fh:
                return max(0, int(float(fh.read().strip())))
        except (OSError, ValueError):
            return self.producer_rate


def now_iso() -> str:
    """UTC now as the contract writes times: 2026-04-17T09:00:10.000Z."""
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def next_tick(now: float, period_s: float) -> float:
    """The next wall-clock multiple of ``period_s`` after ``now`` (ticks line up across systems)."""
    return (math.floor(now / period_s) + 1) * period_s


class Emitter:
    """Writes the contract's JSON lines to stdout, one whole line at a time from any thread."""

    def __init__(self, system: str, instance_id: int, out: TextIO | None = None) -> None:
        self.system = system
        self.instance_id = instance_id
        self.out = out if out is not None else sys.stdout
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """One record, stamped with this replica's id, flushed at once."""
        record.setdefault("instance_id", self.instance_id)
        line = json.dumps(record)
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def descriptor(self, **fields: Any) -> None:
        """The startup record the harness checks against adapter.json."""
        self.write({"kind": "descriptor", "system": self.system, "started_at": now_iso(), **fields})

    def sample(self, metric: str, value: float, window_s: float, t: str | None = None) -> None:
        """One metric of a tick."""
        self.write(
            {
                "t": t or now_iso(),
                "system": self.system,
                "kind": "adapter",
                "subject_kind": "adapter",
                "subject": "",
                "metric": metric,
                "value": float(value),
                "window_s": float(window_s),
            }
        )


class LatencyWindow:
    """Latencies of the last ``window_s`` seconds, for percentiles in bounded memory.

    Values are counted in logarithmic buckets 0.1% wide (three significant figures,
    as an HDR histogram of 3 digits keeps), one counter per bucket per one-second
    slot; slots older than the window are dropped. Memory is bounded by the buckets
    in use, whatever the rate. A percentile is the upper edge of its bucket.
    """

    FLOOR_MS = 0.001
    GROWTH = 1.001

    def __init__(self, window_s: float = PICKUP_WINDOW_S, slot_s: float = 1.0) -> None:
        self.window_s = window_s
        self.slot_s = slot_s
        self._slots: dict[int, dict[int, int]] = {}
        self._lock = threading.Lock()

    def _bucket(self, ms: float) -> int:
        if ms <= self.FLOOR_MS:
            return 0
        return math.ceil(math.log(ms / self.FLOOR_MS) / math.log(self.GROWTH))

    def _value(self, bucket: int) -> float:
        return 0.0 if bucket == 0 else self.FLOOR_MS * self.GROWTH**bucket

    def _expire(self, now: float) -> None:
        oldest = math.floor((now - self.window_s) / self.slot_s) + 1
        for slot in [s for s in self._slots if s < oldest]:
            del self._slots[slot]

    def add(self, ms: float, now: float) -> None:
        """Count one latency (negative values count as 0) observed at monotonic ``now``."""
        slot = math.floor(now / self.slot_s)
        bucket = self._bucket(max(0.0, ms))
        with self._lock:
            counts = self._slots.setdefault(slot, {})
            counts[bucket] = counts.get(bucket, 0) + 1
            if len(self._slots) > self.window_s / self.slot_s + 1:
                self._expire(now)

    def percentiles(self, quantiles: tuple[float, ...], now: float) -> list[float]:
        """The ``quantiles`` (0..1) of the window ending at ``now``; zeros when it is empty."""
        merged: dict[int, int] = {}
        with self._lock:
            self._expire(now)
            for counts in self._slots.values():
                for bucket, n in counts.items():
                    merged[bucket] = merged.get(bucket, 0) + n
        total = sum(merged.values())
        if total == 0:
            return [0.0 for _ in quantiles]
        ordered = sorted(merged.items())
        out: list[float] = []
        for q in quantiles:
            rank = max(1, math.ceil(q * total))
            seen = 0
            for bucket, n in ordered:
                seen += n
                if seen >= rank:
                    out.append(self._value(bucket))
                    break
        return out


class Credit:
    """The contract's fixed-rate pacing: jobs owed for the real time elapsed, not per loop."""

    def __init__(self, now: float) -> None:
        self.last = now
        self.owed = 0.0

    def take(self, now: float, rate: float, cap: int) -> int:
        """Jobs to insert now (at most ``cap``); the rest stays owed for the next call."""
        self.owed += max(0.0, rate) * max(0.0, now - self.last)
        self.last = now
        whole = min(cap, math.floor(self.owed))
        self.owed -= whole
        return whole


def parse_token(line: str) -> int:
    """The job count of an ``ENQUEUE <n>`` line from the harness's pacer; 0 for anything else."""
    head, _, count = line.strip().partition(" ")
    if head != "ENQUEUE":
        return 0
    try:
        return max(0, int(count))
    except ValueError:
        return 0


def payload(seq: int, inserted: float, payload_bytes: int) -> dict[str, Any]:
    """A job's payload: its sequence number, the wall time of its insert, and padding to
    ``JOB_PAYLOAD_BYTES`` of JSON (no padding when the rest is already that long)."""
    body: dict[str, Any] = {"seq": seq, "t": inserted, "pad": ""}
    body["pad"] = "x" * max(0, payload_bytes - len(json.dumps(body)))
    return body


@dataclass(frozen=True)
class Report:
    """What a handler running in another process tells its adapter about one job."""

    inserted: float
    started: float

    def encode(self) -> bytes:
        """The datagram: both wall times, as text."""
        return f"{self.inserted!r} {self.started!r}".encode()

    @classmethod
    def decode(cls, data: bytes) -> Report | None:
        """The report in ``data``; None when it is not one."""
        try:
            inserted, started = (float(x) for x in data.decode().split())
        except (UnicodeDecodeError, ValueError):
            return None
        return cls(inserted, started)

    @property
    def pickup_ms(self) -> float:
        """Insert → handler start, in milliseconds (both clocks are this host's)."""
        return (self.started - self.inserted) * 1000.0


class Reporter:
    """The handler's side of the report socket: one datagram per job, to ``path``.

    Opened lazily in the process that sends (a worker forked after import); a send
    that fails (the adapter gone) is dropped: the handler's job is not the bench's.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._pid = 0

    def send(self, report: Report) -> None:
        """Send ``report``; blocks at most a second when the adapter lags."""
        if not self.path:
            return
        if self._sock is None or self._pid != os.getpid():
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.settimeout(1.0)
            self._pid = os.getpid()
        with contextlib.suppress(OSError):
            self._sock.sendto(report.encode(), self.path)
