"""An app whose workers boot, then die a moment later with no job (issue 12, item 2):
a library's thread, started at fork, that takes the process down."""

from __future__ import annotations

import os
import threading

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("work")
def work(claim: brooq.Claim) -> None:
    """Never reached: nothing is enqueued."""


def _die_soon() -> None:
    threading.Timer(0.3, lambda: os._exit(7)).start()


os.register_at_fork(after_in_child=_die_soon)
