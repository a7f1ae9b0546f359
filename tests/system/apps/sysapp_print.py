"""A handler that prints without flushing: its lines must reach a redirected stdout."""

from __future__ import annotations

import sys

import brooq

queue = brooq.Queue()


def shout(claim: brooq.Claim) -> None:
    """print() to stdout and stderr, no flush: block-buffered when they are files."""
    print(f"printed-by-handler {claim.payload['n']}")
    print(f"stderr-by-handler {claim.payload['n']}", file=sys.stderr)


queue.register("shout", shout)
