"""The topic controls of a Queue: pause and resume a topic on every host (sync and async).

Kept apart from brooq.queue, which holds enqueueing and running; both act on the queue's
store (brooq.engine.pauses says what a pause promises).
"""

from __future__ import annotations

import asyncio

from brooq.engine.store import Store
from brooq.vocabulary import TopicPause


class TopicControls:
    """Pause, resume and list topics through ``self.store`` (a Queue's)."""

    @property
    def store(self) -> Store:
        """The store the controls act on."""
        raise NotImplementedError

    def pause(self, topic: str, reason: str | None = None) -> TopicPause:
        """Pause ``topic`` on every host: within a second no claimer (supervisor, ``brooq
        work``, :meth:`drain`) starts one of its jobs; jobs claimed but not started go back
        uncharged, jobs running finish. Its jobs can still be enqueued, listed, canceled and
        retried. The pause is a row in the database: it outlives every restart until
        :meth:`resume`. Any valid topic may be paused, registered or not (InvalidTopic
        otherwise); pausing a paused topic replaces its reason."""
        return self.store.pause(topic, reason)

    def resume(self, topic: str) -> TopicPause | None:
        """Lift the pause of ``topic``; the pause lifted, None when it was not paused."""
        return self.store.resume(topic)

    def pauses(self) -> list[TopicPause]:
        """Every paused topic (reason, since when, by whom), by name."""
        return self.store.pauses()

    async def pause_async(self, topic: str, reason: str | None = None) -> TopicPause:
        """:meth:`pause` for asyncio apps (on a thread: the loop is never blocked)."""
        return await asyncio.to_thread(self.store.pause, topic, reason)

    async def resume_async(self, topic: str) -> TopicPause | None:
        """:meth:`resume` for asyncio apps (on a thread: the loop is never blocked)."""
        return await asyncio.to_thread(self.store.resume, topic)
