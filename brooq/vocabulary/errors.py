"""The errors brooq raises. Each says what is wrong; the message says what to do."""

from __future__ import annotations


class BrooqError(Exception):
    """Base class of every error brooq raises on purpose."""


class InvalidTopic(BrooqError, ValueError):
    """A topic is not lowercase words separated by dots or dashes."""


class InvalidJob(BrooqError, ValueError):
    """A job cannot be enqueued as given (payload, key, time); nothing was written."""


class InvalidKindOptions(BrooqError, ValueError):
    """Kind options are out of range or contradict each other."""


class JobNotFound(BrooqError, LookupError):
    """No job has this id (it may never have existed or retention deleted it)."""


class KindNotRegistered(BrooqError, LookupError):
    """A claimed job's topic has no handler in this process."""


class StoreUnavailable(BrooqError):
    """The database could not be reached or the connection broke mid-operation."""


class EnqueueConflict(BrooqError):
    """An idempotency key is held by a row this transaction cannot see yet; retry."""
