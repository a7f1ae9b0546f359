"""An in-memory Store with the PostgreSQL store's semantics, for unit tests and ``brooq.testing``.

Split where the store's concepts split: the table and its shared reads
(table.py), the upkeep of the supervisor and the operators (upkeep.py), the
hot path of enqueue, claim and settle (store.py), and the connection settle
hooks get (recording.py).
"""

from brooq.engine.fake.recording import Executed, FakeCursor, RecordingConnection
from brooq.engine.fake.store import InMemoryStore
from brooq.engine.fake.upkeep import expired_text

__all__ = ["Executed", "FakeCursor", "InMemoryStore", "RecordingConnection", "expired_text"]
