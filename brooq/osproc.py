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
# own first connection then hangs. The supervisor's threads do all such work while
# holding this lock, and the loop forks only while it holds it.
_quiet = threading.Lock()


@contextlib.contextmanager
def no_fork() -> Iterator[None]:
    """Hold off forks while the block talks to the database or the network."""
    with _quiet:
        yield


def fork_when_quiet(timeout: float) -> int | None:
    """``os.fork()`` once no thread is inside a :func:`no_fork` block; None after ``timeout``.

    The child continues with the lock released, like the parent.
    """
    if not _quiet.acquire(timeout=timeout):
        return None
    try:
        return os.fork()
    finally:
        _quiet.release()
