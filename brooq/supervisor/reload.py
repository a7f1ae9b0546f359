"""SIGHUP: new application code and new settings into service, checked before any worker sees them.

The mechanism (docs/operations.md, "Upgrading"): the parent imports the app
before it forks (workers boot in milliseconds and share its pages), and on
SIGHUP it imports the app again. The loop never waits for either import:

1. **Check** — a throwaway ``python -m brooq.supervisor.reload --app SPEC``
   imports the new code in a process of its own (bounded by CHECK_TIMEOUT_S),
   with the first import's sys.path and working directory, so code that fails
   to import, exits, or hangs at import never touches the supervisor. The loop
   polls it.
2. **Load** — a thread of the parent forgets the modules of the app's code
   (apploader.py), imports the app again and reads the settings again (.env,
   TOML, credentials; the environment and the command line are the process's
   own and do not change). The loop goes on ticking meanwhile (heartbeats,
   dispatch, /healthz, the watchdog); it only holds new forks off. An import
   that fails (any BaseException, SystemExit included) or outlives its bound
   (three times what the check took, at least LOAD_MIN_S) puts the old
   modules back.
3. **Roll** — a new generation: idle old workers leave first, then busy ones
   as they finish (each within the graceful timeout); the next one is
   retired only when every new worker so far has booted, so new code that
   dies at boot costs one slot, not the fleet.

A failed check or load logs one ``ReloadFailed`` error; the old workers keep
serving the old code. What an import forked is killed once it is over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import IO, Protocol

from brooq.app import load_app
from brooq.config import Settings
from brooq.logs import event
from brooq.queue import Queue
from brooq.supervisor.apploader import AppLoader
from brooq.supervisor.systemd import Notifier

log = logging.getLogger("brooq.supervisor")

CHECK_TIMEOUT_S = 60.0
"""How long the throwaway import may take before the reload is given up."""
LOAD_MIN_S = 5.0
"""The least time the import in the parent is given (it may take 3× what the check took)."""
IMPORT_PATH_ENV = "BROOQ_RELOAD_IMPORT_PATH"
"""The check's environment variable holding the first import's ``sys.path`` (a JSON list)."""
CHECK_PASSED = "brooq-reload-check: imported"
"""What a check prints when the import returned; without it the check failed."""
NEEDS_RESTART = (
    "database_url",
    "http_addr",
    "http_allow_remote",
    "token",
    "lease",
    "poll_interval",
    "prefetch",
    "reaper_period",
    "retention_ttl",
    "retention_batch",
    "retention_period",
    "partition_interval",
    "max_expirations",
    "notify",
    "max_payload_bytes",
    "pgbouncer",
    "listen_url",
    "log_format",
    "http_allowed_hosts",
    "log_level",
)
"""Settings a reload does not apply (connections, listeners and services keep them)."""


@dataclass(frozen=True)
class Loaded:
    """What a successful reload puts into service."""

    queue: Queue
    settings: Settings
    slots: list[list[str]]


def kept_settings(old: Settings, new: Settings) -> tuple[Settings, list[str]]:
    """``new`` with every NEEDS_RESTART setting kept as in ``old``; the names of those that
    changed (they take effect at the next start, and the reload says so)."""
    unapplied = sorted(k for k in NEEDS_RESTART if getattr(old, k, None) != getattr(new, k, None))
    kept = new.replace(**{k: getattr(old, k) for k in NEEDS_RESTART if hasattr(old, k)})
    return kept, unapplied


class Check(Protocol):
    """A throwaway import of the new code, running on its own."""

    def verdict(self) -> str | None:
        """None while it runs; '' when the import passed; else why it failed (one line)."""

    def stop(self) -> None:
        """Kill it if it still runs, and forget it."""


class ImportCheck:
    """The check as a process: ``python -m brooq.supervisor.reload --app SPEC``, importing
    with the module search path and in the working directory of the first import."""

    def __init__(self, loader: AppLoader) -> None:
        self.output: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
        # Metrics the app makes at import must not leave files in the supervisor's folder.
        # Its own sys.path would differ from the supervisor's (its sys.path[0] is the
        # working directory, not the directory of the `brooq` script; other interpreter
        # flags): it imports with the first import's, handed over here.
        env[IMPORT_PATH_ENV] = json.dumps(loader.path)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "brooq.supervisor.reload", "--app", loader.spec],
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            cwd=loader.cwd or None,
            close_fds=True,
            env=env,
        )

    def verdict(self) -> str | None:
        """The check's own word decides, not its exit code: the loop's reaper may have
        collected the process first (the exit code is then lost), and an import that calls
        ``os._exit(0)`` exits 0 without passing."""
        if self.process.poll() is None:
            return None
        self.output.seek(0)
        text = self.output.read().decode(errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if CHECK_PASSED in lines:
            return ""
        if lines:
            return lines[-1][:500]
        return "the check ended without a word (does the import call os._exit?)"

    def stop(self) -> None:
        """Kill the process if it still runs; close its output."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        self.output.close()


class Phase(StrEnum):
    """Where a reload is."""

    IDLE = "idle"
    CHECKING = "checking"
    LOADING = "loading"
    ROLLING = "rolling"


Rolled = Callable[[], tuple[int, int] | None]
"""(workers, generation) once every worker runs the newest generation, else None."""


class Reloader:
    """One reload at a time: the throwaway check, the load in a thread, then the roll."""

    def __init__(
        self,
        loader: AppLoader,
        settings: Callable[[], Settings],
        prepare: Callable[[Queue, Settings], list[list[str]]],
        configured: list[list[str]],
        notifier: Notifier | None = None,
        start_check: Callable[[AppLoader], Check] = ImportCheck,
    ) -> None:
        self.loader, self.settings, self.prepare = loader, settings, prepare
        self.start_check = start_check
        self.notifier = notifier or Notifier()
        self.configured = [sorted(t) for t in configured]
        """The slots the settings gave last time: TTIN/TTOU changes stand until these change."""
        self.phase = Phase.IDLE
        self.again = False
        self.check: Check | None = None
        self.started = self.deadline = 0.0
        self.load_bound = LOAD_MIN_S
        self._lock = threading.Lock()
        self._token = 0
        self._result: Loaded | str | None = None

    @property
    def rolling(self) -> bool:
        """A reload is under way as systemd sees it (RELOADING=1 sent, READY=1 not yet)."""
        return self.phase is not Phase.IDLE

    @property
    def loading(self) -> bool:
        """The parent imports the new code now: no fork until it is done."""
        return self.phase is Phase.LOADING

    def begin(self, now: float) -> None:
        """SIGHUP: start the check (a SIGHUP during a check or load runs one more after it)."""
        if self.phase in (Phase.CHECKING, Phase.LOADING):
            self.again = True
            return
        self.notifier.reloading("reloading: checking the new code")
        self._start_check(now)

    def step(
        self, now: float, *, stopping: bool, rolled: Rolled, cleanup: Callable[[], object]
    ) -> Loaded | None:
        """Each tick: move the reload on; what to put into service now, or None.

        ``cleanup`` kills what an import forked (called once each import is
        over); ``rolled`` says when the new generation runs everywhere.
        """
        if self.phase is Phase.IDLE:
            return None
        if stopping:
            self.cancel()
            return None
        if self.phase is Phase.CHECKING:
            self._poll_check(now, cleanup)
        if self.phase is Phase.LOADING:
            return self._poll_load(now, cleanup)
        if self.phase is Phase.ROLLING and (done := rolled()) is not None:
            workers, generation = done
            self.phase = Phase.IDLE
            self.notifier.reloaded(f"{workers} workers running generation {generation}")
            event(log, "SupervisorReady", workers=workers, generation=generation)
        return None

    def new_slots(self, loaded: Loaded) -> list[list[str]] | None:
        """The slots ``loaded`` configures when they differ from the last configured ones,
        else None: TTIN/TTOU changes stand until the configured slots change."""
        configured = [sorted(t) for t in loaded.slots]
        if configured == self.configured:
            return None
        self.configured = configured
        return configured

    def cancel(self) -> None:
        """Stop a running check and forget a running load (the supervisor is stopping)."""
        if self.check is not None:
            self.check.stop()
            self.check = None
        if self.phase is Phase.LOADING:
            self._abandon()
        self.again, self.phase = False, Phase.IDLE

    # --- check ----------------------------------------------------------------------------

    def _start_check(self, now: float) -> None:
        self.check = self.start_check(self.loader)
        self.phase = Phase.CHECKING
        self.started = now
        self.deadline = now + CHECK_TIMEOUT_S

    def _poll_check(self, now: float, cleanup: Callable[[], object]) -> None:
        assert self.check is not None
        reason = self.check.verdict()
        if reason is None and now < self.deadline:
            return
        if reason is None:
            reason = f"importing the new code took longer than {CHECK_TIMEOUT_S:.0f}s"
        self.check.stop()
        self.check = None
        cleanup()
        if reason:
            self._failed(reason, now)
            return
        self.load_bound = max(LOAD_MIN_S, 3 * (now - self.started))
        self._start_load(now)

    # --- load -----------------------------------------------------------------------------

    def _start_load(self, now: float) -> None:
        with self._lock:
            self._token += 1
            self._result = None
            token = self._token
        self.phase = Phase.LOADING
        self.deadline = now + self.load_bound
        threading.Thread(target=self._load, args=(token,), name="brooq-reload", daemon=True).start()

    def _load(self, token: int) -> None:
        """In the loader thread: settings, the import, the slots; the result or why not."""
        result: Loaded | str
        try:
            settings = self.settings()
            queue = self.loader.load_again()
            result = Loaded(queue, settings, self.prepare(queue, settings))
        except BaseException as exc:  # SystemExit too: a reload never ends the supervisor
            result = f"{type(exc).__name__}: {exc}"
        with self._lock:
            if token == self._token:
                self._result = result
                return
        if isinstance(result, Loaded):  # the loop gave up on this load: undo it
            self.loader.put_back()

    def _poll_load(self, now: float, cleanup: Callable[[], object]) -> Loaded | None:
        with self._lock:
            result = self._result
        if result is None and now < self.deadline:
            return None
        if result is None:
            self._abandon()
            result = (
                f"importing the new code in the supervisor took longer than {self.load_bound:.0f}s"
            )
        cleanup()
        if isinstance(result, str):
            self._failed(result, now)
            return None
        self.phase = Phase.ROLLING
        self._again(now)
        return result

    def _abandon(self) -> None:
        """Give up on the running load: its result will be ignored and undone."""
        with self._lock:
            self._token += 1
        self.loader.put_back()

    # --- endings --------------------------------------------------------------------------

    def _failed(self, reason: str, now: float) -> None:
        event(
            log,
            "ReloadFailed",
            logging.ERROR,
            error=reason,
            note="the workers keep running the code and settings they have",
        )
        self.phase = Phase.IDLE
        if not self._again(now):
            self.notifier.reloaded("reload failed; the old code serves")

    def _again(self, now: float) -> bool:
        """Start the check a SIGHUP asked for while one ran; True if it started."""
        if not self.again:
            return False
        self.again = False
        self._start_check(now)
        return True


def main(argv: list[str] | None = None) -> int:
    """The throwaway check: import the app; print CHECK_PASSED and exit 0, or print one line
    and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m brooq.supervisor.reload", allow_abbrev=False)
    parser.add_argument("--app", required=True)
    args = parser.parse_args(argv)
    given = os.environ.get(IMPORT_PATH_ENV)
    try:
        load_app(args.app, json.loads(given) if given else None)
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    print(CHECK_PASSED, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
