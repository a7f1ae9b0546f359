"""Run a command under the kernel half of brooq.service's sandbox, without systemd.

    python tests/system/sandbox.py -- COMMAND [ARG...]

What systemd would apply for the unit's settings, applied here by hand before exec:

- NoNewPrivileges=yes                  prctl(PR_SET_NO_NEW_PRIVS)
- CapabilityBoundingSet=               every capability dropped from the bounding set
- UMask=0077                           umask
- MemoryDenyWriteExecute=yes           prctl(PR_SET_MDWE, REFUSE_EXEC_GAIN) (Linux 6.3+):
                                       no writable+executable mapping, ever
- SystemCallFilter=@system-service     a seccomp allow-list (libseccomp) of the syscalls
  SystemCallErrorNumber=EPERM          `systemd-analyze syscall-filter` lists; others EPERM
- RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
                                       socket() of any other family fails EAFNOSUPPORT

The mount-namespace settings (ProtectSystem, PrivateTmp, ...) are not reproduced.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import socket
import subprocess
import sys

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
ALLOWED_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)
MAX_FAMILY = 64


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def syscall_set(name: str, seen: set[str] | None = None) -> set[str]:
    """Every syscall of a systemd syscall group, nested groups expanded."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        sys.exit("sandbox: systemd-analyze is missing (apt-get install systemd)")
    out = subprocess.run(
        [analyze, "syscall-filter", name], capture_output=True, text=True, check=True
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        calls |= syscall_set(item, seen) if item.startswith("@") else {item}
    return calls


def check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno() or -result
        sys.exit(f"sandbox: {what} failed: {os.strerror(code)}")


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.exit("usage: sandbox.py -- COMMAND [ARG...]")
    command = argv[1:]
    allowed = syscall_set("@system-service")  # before the filter: this runs a process
    libc = ctypes.CDLL(None, use_errno=True)
    name = ctypes.util.find_library("seccomp")
    if name is None:
        sys.exit("sandbox: libseccomp is missing (it comes with Debian's systemd package)")
    seccomp = ctypes.CDLL(name, use_errno=True)
    seccomp.seccomp_init.restype = ctypes.c_void_p
    seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
    seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    seccomp.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    seccomp.seccomp_load.argtypes = [ctypes.c_void_p]

    os.umask(0o077)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            check(-ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    check(libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0), "PR_SET_MDWE")

    ctx = seccomp.seccomp_init(scmp_act_errno(errno.EPERM))
    if not ctx:
        sys.exit("sandbox: seccomp_init failed")
    for call in sorted(allowed - {"socket"}):
        nr = seccomp.seccomp_syscall_resolve_name(call.encode())
        if nr >= 0:  # names of other architectures do not resolve here
            check(seccomp.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None), call)
    nr_socket = seccomp.seccomp_syscall_resolve_name(b"socket")
    for family in range(MAX_FAMILY):
        action = (
            SCMP_ACT_ALLOW if family in ALLOWED_FAMILIES else scmp_act_errno(errno.EAFNOSUPPORT)
        )
        arg = ArgCmp(0, SCMP_CMP_EQ, family, 0)
        check(
            seccomp.seccomp_rule_add_array(ctx, action, nr_socket, 1, ctypes.byref(arg)),
            f"socket family {family}",
        )
    check(seccomp.seccomp_load(ctx), "seccomp_load")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
