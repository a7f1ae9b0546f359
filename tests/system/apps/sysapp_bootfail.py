"""An app whose worker processes die at boot: a fork hook (as a broken library's
could be) ends every child before it can claim anything."""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("work")
def work(claim: brooq.Claim) -> None:
    """Never reached: the children die first."""


os.register_at_fork(after_in_child=lambda: os._exit(3))
