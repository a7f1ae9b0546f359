"""Helpers for users' unit tests: an in-memory store with the real store's semantics.

``brooq.Queue(brooq.testing.InMemoryStore())`` runs handlers through
``queue.drain()`` without a database.
"""

from brooq.engine.fake import FakeTransaction, InMemoryStore

__all__ = ["FakeTransaction", "InMemoryStore"]
