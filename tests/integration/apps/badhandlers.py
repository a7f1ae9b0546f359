"""Handlers that misbehave in every way a handler can, each on its own topic (one attempt).

Run by a real supervisor in test_bad_input.py: every job must end with a
recorded outcome, the supervisor must live on, and its children count must
come back.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import brooq

queue = brooq.Queue(os.environ.get("DATABASE_URL", "postgresql:///badhandlers-unset"))


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


def _raise(error: BaseException) -> Any:
    def handler(claim: brooq.Claim) -> None:
        raise error

    return handler


def returns_a_value(claim: brooq.Claim) -> Any:
    return {"a value": "nobody reads"}


async def async_returns_a_value(claim: brooq.Claim) -> Any:
    return 42


def exits_the_process(claim: brooq.Claim) -> None:
    os._exit(0)


def sys_exit_zero(claim: brooq.Claim) -> None:
    sys.exit(0)


def chains_an_unserializable_job(claim: brooq.Claim) -> None:
    claim.chain(brooq.Job(topic="bad.returns", payload={"a set": {1, 2}}))


def hook_raises(claim: brooq.Claim) -> None:
    def divide_by_zero(conn: object) -> None:
        1 / 0  # noqa: B018 (raises on purpose)

    claim.on_succeeded(divide_by_zero)


def hook_sql_error(claim: brooq.Claim) -> None:
    claim.on_succeeded(lambda conn: conn.execute("SELECT * FROM no_such_table"))


def negative_delay(claim: brooq.Claim) -> None:
    raise brooq.Delay(-1)


HANDLERS: dict[str, Any] = {
    "bad.system-exit": _raise(SystemExit(3)),
    "bad.sys-exit-zero": sys_exit_zero,
    "bad.keyboard-interrupt": _raise(KeyboardInterrupt()),
    "bad.base-exception": _raise(BaseException("a bare BaseException")),
    "bad.generator-exit": _raise(GeneratorExit()),
    "bad.returns": returns_a_value,
    "bad.async-returns": async_returns_a_value,
    "bad.os-exit": exits_the_process,
    "bad.broken-str": _raise(BrokenStr()),
    "bad.huge-error": _raise(RuntimeError("x" * 100_000)),
    "bad.nul-error": _raise(RuntimeError("before\x00after")),
    "bad.chain-unserializable": chains_an_unserializable_job,
    "bad.hook-raises": hook_raises,
    "bad.hook-sql-error": hook_sql_error,
    "bad.negative-delay": negative_delay,
}

for _topic, _handler in HANDLERS.items():
    queue.register(_topic, _handler, max_attempts=1)
