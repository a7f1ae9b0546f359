"""A database behind this brooq, found by a statement of brooq's rather than at start.

The command line checks the schema before it starts (brooq.postgres.preflight);
the library does not, to keep its hot path free of catalog queries. A
database some migrations behind then fails a statement with a column or
function it lacks: the connector turns that error into :class:`SchemaBehind`,
naming the missing migrations with the same check the CLI runs, on the error
path only. A missing table is SchemaMissing (missing_table), a refused statement
PrivilegeMissing (missing_privilege).
On the caller's own connection (``enqueue(job, conn=…)``), whose transaction
the error aborted, :func:`on_callers_connection` says the same without the
names.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import psycopg

from brooq.postgres.schema import behind_message
from brooq.vocabulary import (
    BrooqError,
    PrivilegeMissing,
    SchemaBehind,
    SchemaMismatch,
    SchemaMissing,
)

BEHIND_ERRORS = (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedFunction)
"""What a statement of brooq's raises on a database that lacks one of its migrations."""
GRANTS_DOC = 'docs/operations.md, "Database roles and grants"'
_RELATION = re.compile(r'relation "([^"]+)" does not exist')


def missing_table(exc: psycopg.errors.UndefinedTable) -> SchemaMissing:
    """The one-line advice for a statement on a table the migrations would have made."""
    match = _RELATION.search(str(exc))
    return SchemaMissing(match[1].rsplit(".", 1)[-1] if match else "job")


def missing_privilege(exc: psycopg.errors.InsufficientPrivilege) -> PrivilegeMissing:
    """The one-line advice for a statement the database role may not run."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else "permission denied"
    return PrivilegeMissing(
        f"the database role lacks a privilege brooq needs ({first}): give it the grants "
        f"of {GRANTS_DOC}"
    )


def schema_behind(exc: psycopg.Error, dsn: str | None) -> BrooqError | None:
    """The clear error for ``exc``, raised by a statement of brooq's; None when the schema is
    this brooq's after all (then ``exc`` is no missing migration: let it through).

    With a DSN the catalog is read once, on a connection of its own, to name the missing
    migrations (check_schema); without one, or when that read fails, the error says what
    the statement found missing.
    """
    from brooq.postgres.preflight import check_schema  # preflight builds on the connector

    text = str(exc).strip()
    detail = text.splitlines()[0] if text else type(exc).__name__
    if dsn is None:
        return SchemaBehind(behind_message(detail))
    try:
        check_schema(dsn)
    except SchemaMismatch as mismatch:  # SchemaBehind, or ahead: either is the reason
        return mismatch
    except (BrooqError, psycopg.Error):
        return SchemaBehind(behind_message(detail))
    return None


def behind_or_missing(missing: SchemaMissing, dsn: str | None) -> BrooqError:
    """What to raise for a table of a later migration (brooq_topic_pause, …) a statement of
    brooq's did not find: the database is behind (SchemaBehind, naming the migrations, by the
    CLI's own check) when that check says so, else ``missing`` as it is."""
    from brooq.postgres.preflight import check_schema  # preflight builds on the connector

    if dsn is None:
        return missing
    try:
        check_schema(dsn)
    except SchemaMismatch as found:  # behind (or ahead): the reason
        return found
    except (BrooqError, psycopg.Error):
        pass
    return missing


@contextlib.contextmanager
def on_callers_connection() -> Iterator[None]:
    """Around brooq's statements on a connection of the caller's: SchemaMissing or
    SchemaBehind instead of psycopg's UndefinedTable, UndefinedColumn, UndefinedFunction
    (the caller's transaction is aborted: nothing more can be read on it)."""
    try:
        yield
    except psycopg.errors.UndefinedTable as exc:
        raise missing_table(exc) from None
    except BEHIND_ERRORS as exc:
        behind = schema_behind(exc, None)
        assert behind is not None
        raise behind from None
