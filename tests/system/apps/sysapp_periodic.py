"""A periodic schedule every minute (missed="latest"), and the kind that runs it."""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])

queue.periodic(
    "* * * * *", topic="tick", name="every-minute", payload={"from": "cron"}, missed="latest"
)


@queue.kind("tick")
def tick(claim: brooq.Claim) -> None:
    """Nothing to do: the row is the record that the run happened."""
