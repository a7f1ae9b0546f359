"""Process details the stdlib leaves to the caller: parent-death signal, RSS, titles."""

from __future__ import annotations

import ctypes
import os
import signal

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
