"""The app of the workflow system test: every run writes down what it saw of its parents.

Kinds:

- ``wf.step``: sleeps ``sleep`` seconds; first inserts into ``wf_seen`` (its own connection,
  autocommit: a run a kill interrupts is written down too) the state of each parent as
  ``claim.parents`` reads it when the handler starts; with ``effect``, inserts its id into
  ``wf_effect`` (primary key: a second insert would fail the settle) in the settle
  transaction (``on_succeeded``: the worker settles it, not the completer). Returns ``n``.
- ``wf.fail``: always fails (one attempt): a parent that ends dead.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psycopg

import brooq

DSN = os.environ["DATABASE_URL"]
queue = brooq.Queue(DSN)
_conn: dict[int, psycopg.Connection[Any]] = {}


def _seen(claim: brooq.Claim) -> None:
    parents = {p: None if v.state is None else str(v.state) for p, v in claim.parents.items()}
    pid = os.getpid()
    if pid not in _conn:  # one connection per worker process, opened after the fork
        _conn[pid] = psycopg.connect(DSN, autocommit=True)
    _conn[pid].execute(
        "INSERT INTO wf_seen (job_id, parents) VALUES (%s, %s::jsonb)",
        (claim.id, json.dumps(parents)),
    )


@queue.kind("wf.step", max_attempts=3, backoff_base="100ms", backoff_max="200ms")
def step(claim: brooq.Claim) -> Any:
    """Write down the parents seen, sleep, record the effect in the settle transaction."""
    p = claim.payload or {}
    _seen(claim)
    time.sleep(float(p.get("sleep", 0)))
    if p.get("effect"):

        def effect(conn: Any) -> None:
            conn.execute("INSERT INTO wf_effect (job_id) VALUES (%s)", (claim.id,))

        claim.on_succeeded(effect)
    return {"n": p.get("n")}


@queue.kind("wf.fail", max_attempts=1)
def fail(claim: brooq.Claim) -> None:
    """Always fails: its children follow their policy."""
    _seen(claim)
    raise RuntimeError("this parent fails")
