"""Helpers for users' unit tests: an in-memory store with the real store's semantics.

``brooq.Queue(brooq.testing.InMemoryStore())`` runs handlers through
``queue.drain()`` without a database. Settle hooks (``claim.on_succeeded``)
get a :class:`RecordingConnection`: its ``execute(sql, params)`` runs nothing
and records the statement, which ``store.executed`` lists once the settle
commits; reading the rows a statement returned raises
:class:`brooq.NeedsDatabase` (naming the hook), out of ``queue.drain()``.
``enqueue(conn=...)`` and ``enqueue_async`` need a real database and raise
:class:`brooq.NeedsDatabase` here.
"""

from brooq.engine.fake import Executed, InMemoryStore, RecordingConnection

__all__ = ["Executed", "InMemoryStore", "RecordingConnection"]
