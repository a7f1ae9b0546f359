"""What the store's statements take and give back: rows into values, values into parameters.

Kept apart from the statements themselves (store.py), so that a reader of a
statement's caller sees the SQL's name and its parameters, and a reader of
this module sees every conversion between PostgreSQL rows and brooq's values.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.store import Claimed, Ticket, TopicCount
from brooq.postgres.dsn import dsn_passwords, scrub
from brooq.vocabulary import JobRecord, KindOptions, State, decode_stored_payload
from brooq.vocabulary.options import stored_overrides
from brooq.vocabulary.secrets import scrub_json

Row = tuple[Any, ...]
"""A row as psycopg's default row factory returns it."""


def record(row: Mapping[str, Any]) -> JobRecord:
    """A JobRecord from a row of the ``get`` statement (its payload still JSON text)."""
    payload, error = decode_stored_payload(row["payload"])
    result = row.get("result")
    workflow = row.get("workflow_id")
    return JobRecord(
        **{
            **row,
            "id": str(row["id"]),
            "workflow_id": None if workflow is None else str(workflow),
            "state": State(row["state"]),
            "payload": payload,
            "payload_error": error,
            "result": None if result is None else decode_stored_payload(result)[0],
        }
    )


def claimed_rows(rows: Iterable[Row], holder: str) -> list[Claimed]:
    """The claims of a claim statement's rows, in claim order (best first).

    A row holds the columns of ``claimed_columns``: eight, then the job's overrides and
    trace context (six more); a row of the eight alone claims a job without them.
    """
    # RETURNING does not keep the ORDER BY of the subquery: restore the claim order.
    ordered = sorted(rows, key=lambda r: (-r[6], r[7], str(r[0])))
    return [
        Claimed(
            Ticket(str(r[0]), holder, r[3]),
            r[1],
            r[2],
            r[5],
            r[4],
            r[6],
            r[7],
            *_controls(r),
        )
        for r in ordered
    ]


def _controls(row: Row) -> tuple[KindOptions | None, str | None]:
    """A claimed row's overrides (None: it has none) and trace context (JSON text)."""
    if len(row) < 14:
        return None, None
    return stored_overrides(row[8:13]), row[13]


def passwords_of(source: str | ConnectionPool | psycopg.Connection[Any]) -> list[str]:
    """The password(s) a store's own error texts must never carry."""
    if isinstance(source, str):
        return dsn_passwords(source)
    if isinstance(source, ConnectionPool):
        conninfo = source.conninfo  # may be a callable, which we do not call
        return dsn_passwords(conninfo) if isinstance(conninfo, str) else []
    try:
        password = source.info.password
    except psycopg.Error:
        return []
    return [password] if password else []


def hidden(outcome: Outcome, secrets: Sequence[str]) -> Outcome:
    """``outcome`` with DSN passwords and known secrets hidden in its error, traceback and
    result: a handler that failed to connect somewhere often quotes the DSN, password and
    all, and one may return its environment. The result stays valid JSON."""
    if outcome.error is None and outcome.traceback is None and outcome.result is None:
        return outcome
    return replace(
        outcome,
        error=outcome.error and scrub(outcome.error, secrets),
        traceback=outcome.traceback and scrub(outcome.traceback, secrets),
        result=outcome.result and scrub_json(outcome.result, secrets),
    )


def settle_params(ticket: Ticket, outcome: Outcome) -> dict[str, Any]:
    """The named parameters of the ``settle`` statement."""
    return {
        "id": ticket.job_id,
        "holder": ticket.holder,
        "attempt": ticket.attempt,
        "state": str(outcome.state),
        "refund": 1 if outcome.refund_attempt else 0,
        "retry_in": outcome.retry_in or timedelta(0),
        "error": outcome.error,
        "traceback": outcome.traceback,
        "result": outcome.result,
    }


def outcomes_json(settles: Sequence[tuple[Ticket, Outcome]]) -> str:
    """The outcomes of ``settle_many`` as one JSON array (PostgreSQL parses it fast)."""
    return json.dumps(
        [
            {
                "id": t.job_id,
                "holder": t.holder,
                "attempt": t.attempt,
                "state": str(o.state),
                "refund": 1 if o.refund_attempt else 0,
                "retry_s": (o.retry_in or timedelta(0)).total_seconds(),
                "error": o.error,
                "traceback": o.traceback,
                "result": o.result,
            }
            for t, o in sorted(settles, key=lambda s: s[0].job_id)  # one lock order: no deadlock
            if o.kind is not SettleKind.ABANDON
        ],
        ensure_ascii=False,
    )


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching every text that starts with ``prefix`` (its wildcards escaped)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def ticket_arrays(tickets: Sequence[Ticket]) -> dict[str, list[Any]]:
    """The tickets as the three parallel arrays the fenced statements unnest."""
    return {
        "ids": [t.job_id for t in tickets],
        "holders": [t.holder for t in tickets],
        "attempts": [t.attempt for t in tickets],
    }


def topic_counts(topics: Iterable[str]) -> list[TopicCount]:
    """How many times each topic appears, sorted by topic."""
    return [TopicCount(t, n) for t, n in sorted(Counter(topics).items())]
