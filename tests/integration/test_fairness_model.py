"""The fair claim on PostgreSQL (which reads only the rows that can be chosen) against the
in-memory store (which orders every ready row): the same jobs, the same claims, the same
jobs claimed, over many keys, priorities, weights and claim sizes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from brooq.engine.fake import InMemoryStore
from brooq.engine.outcome import DONE
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, KindOptions
from tests.integration.test_contract import LEASE


def scenario(seed: int) -> tuple[list[Job], dict[str, Any], list[int], int | None]:
    """Jobs (payload: their number), the fairness, claim sizes and a max_running. Seeds from
    100 on: more keys than most claims take (the walk stops at the claim's size) and keys of
    very different backlogs (claims larger than the keys go round and read more rounds)."""
    rnd = random.Random(seed)
    many = seed >= 100
    keys = [f"k{i}" for i in range(rnd.randint(3, 40) if not many else rnd.randint(30, 120))]
    jobs = []
    for n in range(rnd.randint(40, 300) if not many else rnd.randint(300, 900)):
        key: str | None
        if many:  # skewed: k0 has most jobs, the last keys a few
            key = rnd.choices(keys, weights=[1 / (i + 1) for i in range(len(keys))])[0]
        else:
            key = rnd.choice([*keys, None]) if rnd.random() < 0.9 else None
        priority = rnd.choice([0, 0, 0, 1, 5]) if seed % 2 else 0
        jobs.append(Job("work", n, rate_key=key, priority=priority))
    weights = {k: rnd.randint(1, 4) for k in rnd.sample(keys, k=min(3, len(keys)))}
    fair = {"work": KindOptions(fairness="round_robin", fair_weights=weights).fairness}
    sizes = [rnd.choice([1, 1, 2, 3, 5, 8, 13] + [40, 90, 200] * many) for _ in range(30)]
    return jobs, fair, sizes, rnd.choice([None, None, 7])


@pytest.mark.parametrize("seed", [*range(12), *range(100, 106)])
def test_postgres_claims_what_the_model_claims(
    seed: int, pg_store: PostgresStore, fake_store: InMemoryStore
) -> None:
    jobs, fair, sizes, cap = scenario(seed)
    pg_store.enqueue_many(jobs)
    fake_store.enqueue_many(jobs)
    limits = {"work": cap} if cap else {}
    for i, size in enumerate(sizes):
        claimed = [
            store.claim_many("w", ["work"], LEASE, size, limits, None, fair)
            for store in (pg_store, fake_store)
        ]
        got = [{c.payload for c in batch} for batch in claimed]
        assert got[0] == got[1], f"claim {i} of {size}: postgres {got[0]}, model {got[1]}"
        if i % 2:  # every other claim ends what is running, so the cap leaves room again
            pg_store.settle_many([(c.ticket, DONE) for c in claimed[0]])
            fake_store.settle_many([(c.ticket, DONE) for c in claimed[1]])
