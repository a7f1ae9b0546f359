"""SIGHUP: new application code and new settings into service, checked before any worker sees them.

The mechanism (docs/operations.md, "Upgrading"): the parent imports the app
before it forks (workers boot in milliseconds and share its pages), and on
SIGHUP it imports the app again:

1. **Check** — a throwaway ``python -m brooq.supervisor.reload --app SPEC``
   imports the new code in a process of its own (bounded by CHECK_TIMEOUT_S),
   so code that fails to import, or hangs at import, never touches the
   supervisor. The loop polls it; it never waits for it.
2. **Load** — the parent forgets the modules of the app's code (its package,
   and what it imported from outside the standard library and the installed
   libraries; never compiled extensions or brooq), imports the app again and
   reads the settings again (.env, TOML, credentials; the environment and the
   command line are the process's own and do not change). If anything fails
   here, the old modules are put back.
3. **Roll** — a new generation: workers are replaced one at a time, each old
   one finishing its current job first (up to the graceful timeout); the next
   one is retired only when every new worker so far has booted, so new code
   that dies at boot costs one slot, not the fleet.

A failed check or load logs one ``ReloadFailed`` error; the old workers keep
serving the old code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING

from brooq.app import load_app
from brooq.config import Settings
from brooq.logs import event
from brooq.queue import Queue
from brooq.supervisor.children import RESTART_REASONS
from brooq.supervisor.slots import SlotState

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor

log = logging.getLogger("brooq.supervisor")

CHECK_TIMEOUT_S = 60.0
"""How long the throwaway import may take before the reload is given up."""
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
    "max_expirations",
    "notify",
    "max_payload_bytes",
    "pgbouncer",
    "listen_url",
    "log_format",
    "log_level",
)
"""Settings a reload does not apply (connections, listeners and services keep them)."""

_PATHS = sysconfig.get_paths()
_KEPT_PATHS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {_PATHS["stdlib"], _PATHS["platstdlib"], _PATHS["purelib"], _PATHS["platlib"]}
)
"""The standard library and the installed libraries: never imported again by a reload."""


def _reloadable(name: str, module: ModuleType | None, app_package: str) -> bool:
    """A pure-Python module of the app's package, or outside the stdlib and the installed
    libraries (the project's own code); never brooq."""
    if module is None or name == "brooq" or name.startswith("brooq."):
        return False
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return False  # namespace packages, compiled extensions, frozen modules
    if name == app_package or name.startswith(app_package + "."):
        return True  # the app itself, even installed as a wheel
    resolved = str(Path(path).resolve())
    return not resolved.startswith(_KEPT_PATHS) and "-packages" + os.sep not in resolved


class AppLoader:
    """Imports ``--app`` and remembers which modules that brought in, to import them again."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.package = spec.partition(":")[0].partition(".")[0]
        self.modules: set[str] = set()

    def load(self) -> Queue:
        """The first import (AppLoadError when it fails)."""
        before = set(sys.modules)
        queue = load_app(self.spec)
        self.modules = {
            n for n in set(sys.modules) - before if _reloadable(n, sys.modules[n], self.package)
        }
        return queue

    def load_again(self) -> Queue:
        """Forget the app's modules and import it again; on any error, put the old ones back."""
        saved = {n: sys.modules.pop(n) for n in sorted(self.modules) if n in sys.modules}
        importlib.invalidate_caches()
        before = set(sys.modules)
        try:
            queue = load_app(self.spec)
        except BaseException:
            for name in set(sys.modules) - before:
                sys.modules.pop(name, None)
            sys.modules.update(saved)
            raise
        self.modules = {
            n
            for n in (set(sys.modules) - before) | self.modules
            if _reloadable(n, sys.modules.get(n), self.package)
        }
        return queue


@dataclass(frozen=True)
class Loaded:
    """What a successful reload puts into service."""

    queue: Queue
    settings: Settings
    slots: list[list[str]]


class Reloader:
    """One reload at a time: the throwaway check, then the load in the parent."""

    def __init__(
        self,
        loader: AppLoader,
        settings: Callable[[], Settings],
        prepare: Callable[[Queue, Settings], list[list[str]]],
        configured: list[list[str]],
    ) -> None:
        self.loader, self.settings, self.prepare = loader, settings, prepare
        self.configured = [sorted(t) for t in configured]
        """The slots the settings gave last time: TTIN/TTOU changes stand until these change."""
        self.check: subprocess.Popen[bytes] | None = None
        self.output: IO[bytes] | None = None
        self.deadline = 0.0
        self.again = False
        self.rolling = False
        """A reload is in progress as systemd sees it (RELOADING=1 sent, READY=1 not yet)."""

    @property
    def busy(self) -> bool:
        """True while a check runs."""
        return self.check is not None

    def start(self) -> None:
        """Begin the check (a HUP during a check runs one more after it)."""
        if self.check is not None:
            self.again = True
            return
        self.output = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _finish_check)
        self.check = subprocess.Popen(
            [sys.executable, "-m", "brooq.supervisor.reload", "--app", self.loader.spec],
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            cwd=os.getcwd(),
            close_fds=True,
            # Metrics the app makes at import must not leave files in the supervisor's folder.
            env={k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"},
        )
        self.deadline = time.monotonic() + CHECK_TIMEOUT_S

    def cancel(self) -> None:
        """Stop a running check (the supervisor is stopping)."""
        if self.check is not None:
            with contextlib.suppress(ProcessLookupError):
                self.check.kill()
            self.check.wait()
            self._finish_check()
        self.again = self.rolling = False

    def run_once(self, now: float) -> Loaded | None:
        """Poll the check; once it passed, load in the parent. What to put into service, or None."""
        if self.check is None:
            return None
        code = self.check.poll()
        if code is None and now < self.deadline:
            return None
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                self.check.kill()
            self.check.wait()
            reason = f"importing the new code took longer than {CHECK_TIMEOUT_S:.0f}s"
        else:
            reason = self._last_line() if code else ""
        self._finish_check()
        loaded = self._failed(reason) if reason else self._load()
        if self.again:
            self.again = False
            self.start()
        return loaded

    def _last_line(self) -> str:
        assert self.output is not None
        self.output.seek(0)
        lines = [
            ln for ln in self.output.read().decode(errors="replace").splitlines() if ln.strip()
        ]
        return lines[-1].strip()[:500] if lines else "the check exited with an error"

    def _finish_check(self) -> None:
        if self.output is not None:
            self.output.close()
        self.check, self.output = None, None

    def _load(self) -> Loaded | None:
        try:
            settings = self.settings()
            queue = self.loader.load_again()
            slots = self.prepare(queue, settings)
        except Exception as exc:  # the old code keeps serving, whatever went wrong
            return self._failed(f"{type(exc).__name__}: {exc}")
        return Loaded(queue, settings, slots)

    @staticmethod
    def _failed(reason: str) -> None:
        event(
            log,
            "ReloadFailed",
            logging.ERROR,
            error=reason,
            note="the workers keep running the code and settings they have",
        )
        return None


def apply(sup: Supervisor, loaded: Loaded) -> None:
    """Put ``loaded`` into service in ``sup``: new app, settings, slots; a new generation."""

    old = sup.settings
    unapplied = sorted(
        k for k in NEEDS_RESTART if getattr(old, k, None) != getattr(loaded.settings, k, None)
    )
    sup.queue = loaded.queue
    sup.settings = loaded.settings.replace(
        **{k: getattr(old, k) for k in NEEDS_RESTART if hasattr(old, k)}
    )
    sup.workers.queue, sup.workers.settings = sup.queue, sup.settings  # what new forks run
    sup.dispatcher.kinds = loaded.queue.registry
    sup.producer.limits = {
        t: n
        for t in loaded.queue.registry.topics()
        if (n := loaded.queue.registry.options(t).max_running)
    }
    sup.maintenance.scheduler.schedules = list(loaded.queue.schedules)
    sup.metrics.initialise(
        loaded.queue.registry.topics(),
        [str(r) for r in RESTART_REASONS],
        [s.name for s in loaded.queue.schedules],
    )
    configured = [sorted(t) for t in loaded.slots]
    if sup.reloader is not None and configured != sup.reloader.configured:
        sup.reloader.configured = configured
        sup.slots = [SlotState(t) for t in configured]
        for slot in sup.slots:
            sup.producer.add_group(slot.group)
    sup.generation += 1
    event(
        log,
        "SupervisorReloaded",
        generation=sup.generation,
        workers=len(sup.slots),
        topics=",".join(loaded.queue.registry.topics()),
        needs_restart=",".join(unapplied) or None,
    )


def begin(sup: Supervisor) -> None:
    """SIGHUP: tell systemd, start the check (or, without a reloader, just renew the workers)."""
    event(log, "SupervisorReloading", generation=sup.generation)
    if sup.reloader is None:
        sup.generation += 1
        return
    sup.notifier.reloading("reloading: checking the new code")
    sup.reloader.rolling = True
    sup.reloader.start()


def step(sup: Supervisor, now: float) -> None:
    """Each tick: finish a check, put what it loaded into service, READY=1 once rolled."""
    r = sup.reloader
    if r is None or not r.rolling:
        return
    if sup.stopping:
        r.cancel()
        return
    if r.busy:
        loaded = r.run_once(now)
        if loaded is not None:
            apply(sup, loaded)
        elif not r.busy:  # the check or the load failed: the old workers serve on
            r.rolling = False
            sup.notifier.reloaded("reload failed; the old code serves")
            return
    if not r.busy and rolled(sup):
        r.rolling = False
        sup.notifier.reloaded(f"{len(sup.children)} workers running generation {sup.generation}")
        event(log, "SupervisorReady", workers=len(sup.children), generation=sup.generation)


def rolled(sup: Supervisor) -> bool:
    """True once every worker is of the current generation and has booted."""
    return all(c.generation == sup.generation and c.booted for c in sup.children.values()) and len(
        sup.children
    ) >= len(sup.slots)


def main(argv: list[str] | None = None) -> int:
    """The throwaway check: import the app; exit 0, or print one line and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m brooq.supervisor.reload")
    parser.add_argument("--app", required=True)
    args = parser.parse_args(argv)
    try:
        load_app(args.app)
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
