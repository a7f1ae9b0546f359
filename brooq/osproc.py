"""Process details the stdlib leaves to the caller: parent-death signal, RSS, titles, and
forking safely beside threads."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Iterator

from setproctitle import setproctitle

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit now if it already did."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the child also notices a closed pipe to the parent
    if os.getppid() != parent_pid:
        os._exit(1)


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
