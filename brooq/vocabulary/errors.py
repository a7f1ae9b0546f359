"""The errors brooq raises. Each says what is wrong; the message says what to do."""

from __future__ import annotations


class BrooqError(Exception):
    """Base class of every error brooq raises on purpose."""


class InvalidInput(BrooqError, ValueError):
    """What was given (an argument, a setting, a job) is not valid; nothing was done.

    The command line exits 2 for these and only these: any other error is an
    operation that failed (exit 1) or a bug.
    """


class InvalidTopic(InvalidInput):
    """A topic is not lowercase words separated by dots or dashes."""


class InvalidJob(InvalidInput):
    """A job cannot be enqueued as given (payload, key, time); nothing was written."""


class InvalidKindOptions(InvalidInput):
    """Kind options are out of range or contradict each other."""


class SchemaMissing(InvalidInput):
    """A table brooq needs is not in the database: the migrations were not applied.

    Its message is the whole advice, one line: ``the job table is missing: run
    `brooq migrate up```. Bad input (exit 2): the database given is not ready.
    """

    def __init__(self, table: str) -> None:
        super().__init__(f"the {table} table is missing: run `brooq migrate up`")
        self.table = table


class SchemaMismatch(InvalidInput):
    """The database's migrations are behind or ahead of this brooq; nothing was done.

    Its message names the migrations and the command to run.
    """


class SchemaBehind(SchemaMismatch):
    """The database lacks migrations this brooq needs (a statement of brooq's found no column
    or function it uses, or the start-up check saw them missing); nothing was done.

    Its message names the migrations when they can be read, and says to run
    ``brooq migrate up``.
    """


class PrivilegeMissing(InvalidInput):
    """The database role lacks a privilege brooq needs; the message names it and the grant."""


class JobNotFound(BrooqError, LookupError):
    """No job has this id (it may never have existed or retention deleted it)."""


class KindNotRegistered(BrooqError, LookupError):
    """A claimed job's topic has no handler in this process."""


class NeedsDatabase(BrooqError, TypeError):
    """The operation needs a real database transaction, which the in-memory store has not."""


class StoreUnavailable(BrooqError):
    """The database could not be reached or the connection broke mid-operation."""


class EnqueueConflict(BrooqError):
    """An idempotency key is held by a row this transaction cannot see yet; retry."""
