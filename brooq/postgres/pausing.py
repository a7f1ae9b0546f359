"""The PostgreSQL store's pauses: one row of ``brooq_topic_pause`` per paused topic.

Claims leave paused topics out before they reach SQL (brooq.engine.pauses.PauseView),
so the claim statements stay as they are and a paused topic costs a claim nothing.
"""

from __future__ import annotations

from brooq.engine.pauses import PauseView
from brooq.postgres.behind import behind_or_missing
from brooq.postgres.connect import Connector
from brooq.postgres.rows import Row
from brooq.postgres.sql import sql
from brooq.vocabulary import SchemaMissing, TopicPause, pause_request
from brooq.vocabulary.pause import pause_author


def pause_of(row: Row) -> TopicPause:
    """A row of ``pause_topic``, ``resume_topic`` or ``topic_pauses``."""
    return TopicPause(row[0], row[1], row[2], row[3])


class PostgresPauses:
    """Pause, resume and list topics; the view of them the claims use (it holds the
    ``connector``)."""

    connector: Connector
    _pause_view: PauseView | None = None

    @property
    def pause_view(self) -> PauseView:
        """The paused topics, at most PAUSE_REFRESH_S old (one cheap read when older)."""
        if self._pause_view is None:
            self._pause_view = PauseView(self.paused_topics)
        return self._pause_view

    def paused_topics(self) -> set[str]:
        """The names of the paused topics, read now (SchemaBehind on a database without
        migration 0014: the first read of a claim is this one)."""
        try:
            with self.connector.connection() as conn:
                return {r[0] for r in conn.execute(sql("paused_topic_names")).fetchall()}
        except SchemaMissing as missing:
            raise behind_or_missing(missing, self.connector.catalog_dsn) from None

    def pause(self, topic: str, reason: str | None = None, by: str | None = None) -> TopicPause:
        """Pause ``topic`` on every host (NOTIFY brooq_pause); the pause as stored."""
        checked, reason = pause_request(topic, reason)
        params = {"topic": str(checked), "reason": reason, "by": by or pause_author()}
        with self.connector.connection() as conn:
            row = conn.execute(sql("pause_topic"), params).fetchone()
        self.pause_view.forget()
        assert row is not None  # an upsert returns its row
        return pause_of(row)

    def resume(self, topic: str) -> TopicPause | None:
        """Lift the pause of ``topic`` (NOTIFY brooq_pause); the pause lifted, or None."""
        checked, _ = pause_request(topic, None)
        with self.connector.connection() as conn:
            row = conn.execute(sql("resume_topic"), {"topic": str(checked)}).fetchone()
        self.pause_view.forget()
        return None if row is None else pause_of(row)

    def pauses(self) -> list[TopicPause]:
        """Every paused topic, by name."""
        with self.connector.connection() as conn:
            return [pause_of(r) for r in conn.execute(sql("topic_pauses")).fetchall()]
