"""Hostile handlers (issue 12), each on its own topic, for tests/system/test_hostile.py.

- ``noop``: does nothing (its payloads are the attack: jsonb Python cannot decode);
- ``fd.close-low``: ``os.close`` of every fd from 0 to 10, then returns;
- ``fd.closerange``: ``os.closerange(3, 1024)`` (the socket to the supervisor too);
- ``fd.closerange-hang``: the same, then sleeps for 10 minutes;
- ``fd.effect``: succeeds with an ``on_succeeded`` hook, so the worker's own
  connection is used (the one a closed descriptor would wedge);
- ``err.*``: exceptions whose text is hostile (a lone surrogate, a ``__str__``
  that raises KeyboardInterrupt, 10 MB, terminal escapes and line separators,
  the DSN and its password, the environment, words that hold the test
  cluster's password ``brooq``);
- ``result.environment``: returns the whole environment (``dict(os.environ)``) and a
  string that quotes the DSN; ``result.environment-effect`` the same with an
  ``on_succeeded`` hook (its worker settles it on its own connection);
- ``fork.grandchild``: forks a process that ignores SIGTERM and sleeps (in a
  session of its own when the payload says ``setsid``); its pid goes to the
  file named by the payload's ``pidfile``;
- ``fork.escape-twice``: forks a process that starts a session of its own and
  forks another that starts one more (two process groups escaped); both
  ignore SIGTERM and sleep; their pids go to the ``pidfile``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any
from urllib.parse import urlsplit

import brooq

DSN = os.environ.get("DATABASE_URL", "postgresql:///hostile-unset")
queue = brooq.Queue(DSN)

RETRY = {"backoff_base": "10ms", "backoff_max": "20ms"}


def noop(claim: brooq.Claim) -> None:
    """Nothing: the payload was the attack."""


def close_low(claim: brooq.Claim) -> None:
    """Close every descriptor from 0 to 10, whatever it is."""
    for fd in range(0, 11):
        with contextlib.suppress(OSError):
            os.close(fd)


def close_range(claim: brooq.Claim) -> None:
    """Close every descriptor above stderr."""
    os.closerange(3, 1024)


def close_range_and_hang(claim: brooq.Claim) -> None:
    """Close every descriptor above stderr, then never return (nor report)."""
    os.closerange(3, 1024)
    time.sleep(600)


def effect(claim: brooq.Claim) -> None:
    """Succeed with an effect: the worker settles it on its own connection."""
    claim.on_succeeded(lambda conn: conn.execute("SELECT 1"))


class StrRaises(Exception):
    """An exception whose text cannot be read: ``str()`` raises KeyboardInterrupt."""

    def __str__(self) -> str:
        raise KeyboardInterrupt


def _raise(error: BaseException) -> Any:
    def handler(claim: brooq.Claim) -> None:
        raise error

    return handler


def _password() -> str:
    return urlsplit(DSN).password or "no-password-in-dsn"


def dsn_in_error(claim: brooq.Claim) -> None:
    """What a handler that fails to connect somewhere may well raise."""
    raise RuntimeError(f"cannot connect to {DSN} (retry later)")


def password_in_error(claim: brooq.Claim) -> None:
    """The password alone, as a parse error would quote it."""
    raise ValueError(f'invalid percent-encoded token: "{_password()}"')


def environment_in_error(claim: brooq.Claim) -> None:
    """What a handler that prints its environment into an exception raises."""
    shown = {k: v for k, v in os.environ.items() if k.startswith(("BROOQ_", "DATABASE_"))}
    raise RuntimeError(f"bad configuration: {shown}")


def environment_as_result(claim: brooq.Claim) -> Any:
    """What a careless handler returns: its environment, secrets and all."""
    return {"env": dict(os.environ), "note": [f"connected to {DSN} as planned"]}


def environment_as_result_with_effect(claim: brooq.Claim) -> Any:
    """The same, settled with an effect in the worker's own transaction."""
    claim.on_succeeded(lambda conn: conn.execute("SELECT 1"))
    return environment_as_result(claim)


def fork_grandchild(claim: brooq.Claim) -> None:
    """Leave a process behind that ignores SIGTERM (and keeps the worker's title)."""
    pid = os.fork()
    if pid == 0:
        try:
            if claim.payload.get("setsid"):
                os.setsid()  # out of the worker's process group: only the subreaper sees it
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        finally:
            os._exit(0)
    with open(claim.payload["pidfile"], "w") as f:
        f.write(str(pid))


def escape_twice(claim: brooq.Claim) -> None:
    """Leave two processes behind, each in a session of its own, the second forked by the first."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        try:
            os.close(read_end)
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            inner = os.fork()
            if inner == 0:
                os.close(write_end)
                os.setsid()  # out of the first escapee's group too
                time.sleep(600)
            else:
                os.write(write_end, f"{os.getpid()} {inner}".encode())
                os.close(write_end)
                time.sleep(600)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe, open(claim.payload["pidfile"], "w") as f:
        f.write(pipe.read())


queue.register("noop", noop, max_attempts=3, **RETRY)
queue.register("fd.close-low", close_low, max_attempts=2, **RETRY)
queue.register("fd.closerange", close_range, max_attempts=2, **RETRY)
queue.register("fd.closerange-hang", close_range_and_hang, max_attempts=1)
queue.register("fd.effect", effect, max_attempts=3, **RETRY)
queue.register("err.surrogate", _raise(ValueError("bad \udcff")), max_attempts=1)
queue.register("err.str-interrupt", _raise(StrRaises()), max_attempts=1)
queue.register("err.huge", _raise(RuntimeError("x" * 10_000_000)), max_attempts=1)
queue.register(
    "err.escapes",
    _raise(RuntimeError("\x1b[2J\x1b[31mred\nstate            done\rback\u2028sep\x85nel")),
    max_attempts=1,
)
queue.register("err.dsn", dsn_in_error, max_attempts=1)
queue.register("err.password", password_in_error, max_attempts=1)
queue.register("err.environment", environment_in_error, max_attempts=1)
queue.register(
    "err.words",
    _raise(RuntimeError("brooq.Delay(5) is no error of /srv/brooq/engine/executor.py")),
    max_attempts=1,
)
queue.register("result.environment", environment_as_result, max_attempts=1)
queue.register("result.environment-effect", environment_as_result_with_effect, max_attempts=1)
queue.register("fork.grandchild", fork_grandchild, max_attempts=1)
queue.register("fork.escape-twice", escape_twice, max_attempts=1)
