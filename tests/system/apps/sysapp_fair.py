"""A fair kind and a plain one; each job's result is the time its handler started."""

from __future__ import annotations

import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("fair.work", fairness="round_robin")
def fair_work(claim: brooq.Claim) -> float:
    """When it started (the wall clock)."""
    return time.time()


@queue.kind("plain.work")
def plain_work(claim: brooq.Claim) -> float:
    """When it started (the wall clock)."""
    return time.time()
