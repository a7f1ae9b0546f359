"""A middleware that sets a tenant for the handler (sync and async handlers alike), refuses
payloads marked so (a middleware's exception: the attempt fails, the worker lives on), and
counts what it heard in the row the handler returns."""

from __future__ import annotations

import asyncio
import contextvars
import os
from typing import Any

import brooq

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


class Tenant(brooq.Middleware):
    """Runs every handler with the payload's tenant set; refuses {"refuse": true}."""

    def run(self, claim: brooq.Claim, call_next: Any) -> Any:
        if claim.payload.get("refuse"):
            raise PermissionError(f"tenant {claim.payload['tenant']} is suspended")
        token = TENANT.set(claim.payload["tenant"])
        try:
            return {"tenant": call_next(claim), "pid": os.getpid()}
        finally:
            TENANT.reset(token)


queue = brooq.Queue(os.environ["DATABASE_URL"], middleware=[Tenant()])


@queue.kind("plain", max_attempts=1)
def plain(claim: brooq.Claim) -> str:
    """Return the tenant the middleware set."""
    return TENANT.get()


@queue.kind("coro", max_attempts=1)
async def coro(claim: brooq.Claim) -> str:
    """The same, from an async handler."""
    await asyncio.sleep(0)
    return TENANT.get()
