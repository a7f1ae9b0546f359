"""Process details the stdlib leaves to the caller: parent-death signal, RSS, titles, and
forking safely beside threads."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from setproctitle import setproctitle

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit now if it already did."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the child also notices a closed pipe to the parent
    if os.getppid() != parent_pid:
        os._exit(1)


def flush_stdio() -> None:
    """Flush stdout and stderr, whatever they are now (before an ``os._exit``, which skips
    it); never raises."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False  # not Linux


# Grandchildren: a handler may fork (or run a tool that does). Each worker leads a
# process group of its own, so what it leaves behind dies with it; and the
# supervisor is a subreaper, so what escaped that group (setsid, a double fork) is
# reparented to it rather than to init, and killed when it stops.
def become_subreaper() -> bool:
    """Have orphaned descendants reparented to this process (Linux); True if it took."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def lead_process_group() -> None:
    """Make this process the leader of a new process group (its forks join it)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def reap_any() -> tuple[int, int] | None:
    """``waitpid(-1, WNOHANG)``, having first SIGKILLed what is left of the ended child's
    process group (a worker's forks). None when no child has ended.

    The child is looked at before it is reaped: until then its pid, and so its
    group's id, cannot be reused by another process.
    """
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    with contextlib.suppress(OSError):
        if os.getpgid(info.si_pid) == info.si_pid:
            os.killpg(info.si_pid, signal.SIGKILL)
    pid, status = os.waitpid(info.si_pid, 0)
    return pid, status


def _parents() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state letter) of every process (Linux /proc; empty elsewhere)."""
    found: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry)] = (int(fields[1]), fields[0])
    return found


def kill_tree(pid: int) -> bool:
    """SIGKILL ``pid`` and the process group it leads; True if it was there to kill."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True


def drain(fd: int) -> None:
    """Read a non-blocking pipe empty (a self-pipe that only wakes a loop)."""
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def children_of(ppid: int) -> list[int]:
    """The pids whose parent is ``ppid`` (Linux /proc; empty where unavailable)."""
    return [pid for pid, (parent, _) in _parents().items() if parent == ppid]


def descendants_of(root: int) -> list[int]:
    """Every live (not zombie) process below ``root``: children, theirs, and so on."""
    below: dict[int, list[int]] = {}
    live = set()
    for pid, (parent, state) in _parents().items():
        below.setdefault(parent, []).append(pid)
        if state not in ("Z", "X"):
            live.add(pid)
    found, todo = [], list(below.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in live:
            found.append(pid)
        todo += below.get(pid, [])
    return found


KILL_ALL_S = 2.0
"""How long :func:`kill_children` keeps killing what keeps appearing (a fork loop)."""


def kill_children(timeout: float = KILL_ALL_S) -> list[int]:
    """SIGKILL every process below this one, and the process groups they lead; the pids killed.

    Not one pass: a process that escaped its group twice (``setsid`` in a
    child of a ``setsid`` child) is not a child of ours until its parent dies,
    and something may fork meanwhile. So every descendant is killed, what
    ended is reaped (a subreaper inherits the orphans of what it reaps), and
    again, until nothing is left below this process or ``timeout`` passes.
    """
    deadline = time.monotonic() + timeout
    killed: list[int] = []
    while True:
        left = descendants_of(os.getpid())
        killed += [pid for pid in left if kill_tree(pid)]
        _reap_ended()
        if not left or time.monotonic() >= deadline:
            return killed
        time.sleep(0.005)


def _reap_ended() -> None:
    """Collect every child that has ended (so that its own orphans become ours)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def pid_alive(pid: int) -> bool:
    """True while a process with ``pid`` exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours
    return True


FdIdentity = tuple[int, int] | None
"""What a descriptor refers to (device, inode), or None when it is closed."""


def fd_identities(fds: list[int]) -> dict[int, FdIdentity]:
    """The identity of each of ``fds``: a handler that closed one, or closed it and opened
    something else under its number, changes it."""
    out: dict[int, FdIdentity] = {}
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            out[fd] = None
        else:
            out[fd] = (st.st_dev, st.st_ino)
    return out


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def title(text: str) -> None:
    """Show ``text`` as this process's name in ps/top."""
    setproctitle(text)


def describe_exit(status: int) -> str:
    """``exited with code 3`` or ``killed by SIGKILL`` from a waitpid status."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


# A process that forks while one of its threads is inside libpq, a DNS lookup or a
# socket call can hand the child a lock that nobody will ever release: the child's
# own first connection then hangs. The supervisor's threads do all such work inside
# no_fork() (any number at once), and the loop forks only when none is inside.
class _ForkGate:
    """Many threads may be inside at once; a fork waits until none is, and holds new ones off."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._forking = False

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._forking)
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def fork(self, timeout: float) -> int | None:
        with self._cond:
            self._forking = True
            try:
                if not self._cond.wait_for(lambda: self._inside == 0, timeout):
                    return None
                return os.fork()
            finally:
                self._forking = False
                self._cond.notify_all()


_gate = _ForkGate()


def no_fork() -> contextlib.AbstractContextManager[None]:
    """Hold off forks while the block talks to the database or the network."""
    return _gate.inside()


def fork_when_quiet(timeout: float) -> int | None:
    """``os.fork()`` once no thread is inside a :func:`no_fork` block; None after ``timeout``.

    New :func:`no_fork` blocks wait meanwhile. The child continues with the gate
    open, like the parent.
    """
    return _gate.fork(timeout)
