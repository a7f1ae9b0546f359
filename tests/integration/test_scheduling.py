"""Scheduling in the store: priorities, per-topic max_running, settle-and-claim, claim plans.

Order and limit tests run against the in-memory fake and real PostgreSQL, so
the fake is proven to match; the concurrency hammer and the EXPLAIN checks
need the real database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from brooq.engine.fake import InMemoryStore
from brooq.engine.outcome import DONE, Outcome, SettleKind
from brooq.engine.store import Claimed, Store, Ticket
from brooq.postgres.sql import sql
from brooq.postgres.store import PostgresStore
from brooq.queue import Queue
from brooq.vocabulary import Claim, InvalidJob, Job, State
from tests.integration.helpers import preserved_signals
from tests.integration.plans import Layout

LEASE = timedelta(minutes=5)
RETRY_NOW = Outcome(SettleKind.FAILED, "failed", timedelta(0), error="RuntimeError: again")


@pytest.fixture(params=["fake", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each test runs once per store."""
    if request.param == "fake":
        return request.getfixturevalue("fake_store")  # type: ignore[no-any-return]
    return request.getfixturevalue("pg_store")  # type: ignore[no-any-return]


def store_now(store: Store) -> datetime:
    """The store's own time: the fake's clock, or PostgreSQL's now()."""
    if isinstance(store, InMemoryStore):
        return store.now()
    assert isinstance(store, PostgresStore)
    with store.connector.connection() as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def add(store: Store, topic: str = "work", **kw: Any) -> str:
    (result,) = store.enqueue_many([Job(topic=topic, **kw)])
    assert result.created
    return result.id


def claim_all(store: Store, topics: list[str], holder: str = "w1") -> list[str]:
    """Claim (and settle done) until nothing is ready; the ids in claim order."""
    got: list[str] = []
    while (claimed := store.claim(holder, topics, LEASE)) is not None:
        got.append(claimed.id)
        assert store.settle(claimed.ticket, DONE)
        assert len(got) < 1000
    return got


# -- priorities -------------------------------------------------------------------------------


@pytest.mark.parametrize("topics", [["work"], ["work", "other"]], ids=["one-topic", "topics"])
def test_priority_then_available_at_then_enqueue_order(store: Store, topics: list[str]) -> None:
    """Higher priority first; equal priority by available_at; equal both by enqueue order."""
    t = store_now(store)
    other = topics[-1]
    low_old = add(store, payload="low-old", priority=0, available_at=t - timedelta(hours=1))
    high_late = add(
        store, other, payload="high-late", priority=5, available_at=t - timedelta(seconds=1)
    )
    same = store.enqueue_many(
        [
            Job("work", f"same-{i}", priority=5, available_at=t - timedelta(seconds=30))
            for i in range(4)
        ]
    )
    high_early = add(
        store, other, payload="high-early", priority=5, available_at=t - timedelta(seconds=40)
    )
    top = add(store, payload="top", priority=32767, available_at=t - timedelta(seconds=2))
    negative = add(
        store, other, payload="negative", priority=-3, available_at=t - timedelta(days=1)
    )
    low_new = add(store, payload="low-new", priority=0, available_at=t - timedelta(minutes=1))
    add(store, payload="future", priority=100, available_at=t + timedelta(hours=1))
    add(store, "unserved", payload="unserved", priority=100, available_at=t - timedelta(hours=1))

    expected = [top, high_early, *[r.id for r in same], high_late, low_old, low_new, negative]
    assert claim_all(store, topics) == expected


def test_a_retried_job_keeps_its_priority(store: Store) -> None:
    t = store_now(store)
    retried = add(store, priority=7, available_at=t - timedelta(seconds=5))
    plain = add(store, priority=1, available_at=t - timedelta(minutes=5))
    first = store.claim("w1", ["work"], LEASE)
    assert first is not None and first.id == retried
    assert store.settle(first.ticket, RETRY_NOW)  # failed, ready again at once
    assert store.get(retried).state is State.FAILED and store.get(retried).priority == 7
    assert claim_all(store, ["work"]) == [retried, plain]


def test_starvation_a_stream_of_high_priority_jobs_keeps_a_low_one_waiting(store: Store) -> None:
    """The documented starvation: priority is strict, so the low job waits for a pause."""
    t = store_now(store)
    low = add(store, payload="low", priority=0, available_at=t - timedelta(hours=1))
    for i in range(30):  # a steady stream: one new high job before every claim
        add(store, payload=f"high-{i}", priority=10)
        claimed = store.claim("w1", ["work"], LEASE)
        assert claimed is not None and claimed.id != low, f"the low job ran during the stream ({i})"
        assert claimed.payload == f"high-{i}"
        assert store.settle(claimed.ticket, DONE)
    assert store.get(low).state is State.PENDING
    # The stream pauses: the low job runs next.
    claimed = store.claim("w1", ["work"], LEASE)
    assert claimed is not None and claimed.id == low


def test_starvation_through_the_runner_low_job_runs_once_the_stream_stops(store: Store) -> None:
    """The same through real handlers: each high job chains the next until the stream ends."""
    queue = Queue(store)
    ran: list[str] = []

    @queue.kind("work")
    def handle(claim: Claim) -> None:
        ran.append(claim.payload["name"])
        n = claim.payload.get("n")
        if n is not None and n < 20:
            claim.chain(Job("work", {"name": f"high-{n + 1}", "n": n + 1}, priority=10))

    t = store_now(store)
    queue.enqueue(Job("work", {"name": "low"}, available_at=t - timedelta(hours=1)))
    queue.enqueue(Job("work", {"name": "high-0", "n": 0}, priority=10))
    with preserved_signals():
        drained = queue.drain()
    assert drained.total == 22
    assert ran == [f"high-{i}" for i in range(21)] + ["low"]


@pytest.mark.parametrize("bad", [True, False, 32768, -32769, 1.0, "1", None])
def test_job_priority_must_be_a_small_int(bad: Any) -> None:
    with pytest.raises(InvalidJob, match="priority"):
        Job("work", priority=bad)


@pytest.mark.parametrize("good", [-32768, -1, 0, 1, 32767])
def test_job_priority_range(good: int) -> None:
    assert Job("work", priority=good).priority == good


def test_priority_is_stored_and_read_back(store: Store) -> None:
    job_id = add(store, priority=-32768)
    assert store.get(job_id).priority == -32768
    assert store.get(add(store)).priority == 0


# -- max_running ------------------------------------------------------------------------------


def test_max_running_caps_claims_across_holders(store: Store) -> None:
    """K=2, 5 ready jobs, 3 holders: only 2 get jobs; once one settles another may claim."""
    for i in range(5):
        add(store, "report", payload=i)
    limits = {"report": 2}
    a = store.claim("a", ["report"], LEASE, limits)
    b = store.claim("b", ["report"], LEASE, limits)
    assert a is not None and b is not None
    assert store.claim("c", ["report"], LEASE, limits) is None
    assert store.claim("c", ["report"], LEASE, limits) is None
    # Without the limit the same holder would get one: the cap is what stops it.
    assert store.settle(a.ticket, DONE)
    c = store.claim("c", ["report"], LEASE, limits)
    assert c is not None and c.id not in (a.id, b.id)
    assert store.claim("a", ["report"], LEASE, limits) is None
    # A failed (retry) settle also frees the slot.
    assert store.settle(b.ticket, RETRY_NOW)
    d = store.claim("a", ["report"], LEASE, limits)
    assert d is not None
    assert store.claim("b", ["report"], LEASE, limits) is None


def test_max_running_counts_every_holder_even_unlimited_claimers(store: Store) -> None:
    """The cap counts rows in flight, whoever claimed them."""
    for i in range(4):
        add(store, "report", payload=i)
    assert store.claim("old-version", ["report"], LEASE) is not None  # no limits passed
    assert store.claim("old-version", ["report"], LEASE) is not None
    assert store.claim("capped", ["report"], LEASE, {"report": 2}) is None
    assert store.claim("capped", ["report"], LEASE, {"report": 3}) is not None


def test_max_running_limits_per_topic_are_independent(store: Store) -> None:
    for topic in ("a", "b", "free"):
        for i in range(3):
            add(store, topic, payload=i)
    limits = {"a": 1, "b": 2}
    got: list[str] = []
    while claimed := store.claim(f"h{len(got)}", ["a", "b", "free"], LEASE, limits):
        got.append(claimed.topic)
        assert len(got) < 20
    assert sorted(got) == ["a", "b", "b", "free", "free", "free"]
    # A full topic does not block the others: more free jobs are still claimed.
    add(store, "free", payload="more")
    more = store.claim("h", ["a", "b", "free"], LEASE, limits)
    assert more is not None and more.topic == "free"
    assert store.claim("h", ["a"], LEASE, limits) is None
    assert store.claim("h", ["b"], LEASE, limits) is None


def test_max_running_keeps_priority_order(store: Store) -> None:
    t = store_now(store)
    low = add(store, "report", priority=0, available_at=t - timedelta(hours=1))
    high = add(store, "report", priority=9)
    first = store.claim("a", ["report"], LEASE, {"report": 1})
    assert first is not None and first.id == high
    assert store.claim("b", ["report"], LEASE, {"report": 1}) is None
    assert store.settle(first.ticket, DONE)
    second = store.claim("b", ["report"], LEASE, {"report": 1})
    assert second is not None and second.id == low


def test_max_running_through_the_runner_of_a_queue(store: Store) -> None:
    """``@queue.kind(..., max_running=K)`` reaches the claim: the runner passes the limit."""
    queue = Queue(store)
    inside: list[int] = []

    @queue.kind("report", max_running=1)
    def handle(claim: Claim) -> None:
        # While this runs, another holder cannot claim a second report job.
        other = store.claim("other", ["report"], LEASE, {"report": 1})
        inside.append(0 if other is None else 1)

    for i in range(3):
        queue.enqueue(Job("report", i))
    with preserved_signals():
        assert queue.drain().total == 3
    assert inside == [0, 0, 0]


def _hammer_claimer(
    dsn: str, topic: str, k: int, stop: threading.Event, counts: list[int], errors: list[str]
) -> None:
    store = PostgresStore(dsn)
    holder = f"hammer-{threading.get_ident()}"
    try:
        while not stop.is_set():
            claimed = store.claim(holder, [topic, "free"], LEASE, {topic: k})
            if claimed is None:
                time.sleep(0.001)
                continue
            time.sleep(0.002)  # hold it a little, so claims overlap
            if not store.settle(claimed.ticket, DONE):
                errors.append(f"lost the lease of {claimed.id}")
            counts.append(1)
    except Exception as exc:  # reported to the test
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_concurrent_claimers_never_exceed_max_running(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """8 threads with their own connections claim and settle; a sampler never sees more than K."""
    k, jobs = 3, 400
    pg.execute(
        "INSERT INTO job (topic, payload) SELECT 'report', to_jsonb(i) "
        "FROM generate_series(1, %s) AS i",
        (jobs,),
    )
    pg.execute(
        "INSERT INTO job (topic, payload) SELECT 'free', to_jsonb(i) "
        "FROM generate_series(1, 100) AS i"
    )
    stop = threading.Event()
    counts: list[int] = []
    errors: list[str] = []
    threads = [
        threading.Thread(target=_hammer_claimer, args=(dsn, "report", k, stop, counts, errors))
        for _ in range(8)
    ]
    samples: list[int] = []
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 40
        with psycopg.connect(dsn, autocommit=True) as sampler:
            while time.monotonic() < deadline:
                row = sampler.execute(
                    "SELECT count(*) FILTER (WHERE state = 'processing'), "
                    "       count(*) FILTER (WHERE state IN ('pending', 'processing')) "
                    "FROM job WHERE topic = 'report'"
                ).fetchone()
                assert row is not None
                samples.append(row[0])
                if row[1] == 0:
                    break
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not errors, errors[:5]
    assert not any(t.is_alive() for t in threads)
    left = pg.execute("SELECT count(*) FROM job WHERE topic = 'report' AND state <> 'done'")
    assert left.fetchone() == (0,), "the claimers did not finish in time"
    assert len(samples) >= 200, f"only {len(samples)} samples"
    assert max(samples) <= k, f"saw {max(samples)} report jobs processing at once (K={k})"
    assert max(samples) == k, "the claimers never reached the limit: the test proves nothing"


# -- claims in batches and outcomes in batches (the supervisor's producer and completer) ---------


def test_claim_many_takes_the_best_first_up_to_the_limit(store: Store) -> None:
    t = store_now(store)
    low = add(store, priority=0, available_at=t - timedelta(hours=1))
    high = add(store, "other", priority=3)
    old = add(store, priority=3, available_at=t - timedelta(minutes=5))
    later = add(store, priority=3, available_at=t + timedelta(hours=1))  # not ready
    got = store.claim_many("w1", ["work", "other"], LEASE, 2)
    assert [c.id for c in got] == [old, high]
    assert all(store.get(c.id).state is State.PROCESSING for c in got)
    rest = store.claim_many("w1", ["work", "other"], LEASE, 10)
    assert [c.id for c in rest] == [low]
    assert store.get(later).state is State.PENDING


def test_claim_many_never_goes_beyond_max_running(store: Store) -> None:
    for _ in range(6):
        add(store, "capped")
    first = store.claim_many("w1", ["capped"], LEASE, 10, {"capped": 4})
    assert len(first) == 4
    assert store.claim_many("w2", ["capped"], LEASE, 10, {"capped": 4}) == []
    store.settle(first[0].ticket, DONE)
    assert len(store.claim_many("w2", ["capped"], LEASE, 10, {"capped": 4})) == 1


def test_settle_many_writes_what_is_held_and_reports_the_rest(store: Store) -> None:
    ids = [add(store, payload=i) for i in range(3)]
    claimed = store.claim_many("w1", ["work"], LEASE, 3)
    assert sorted(c.id for c in claimed) == sorted(ids)
    by_id = {c.id: c for c in claimed}
    stale = Ticket(ids[2], "w1", by_id[ids[2]].ticket.attempt + 1)  # not this attempt
    written = store.settle_many(
        [(by_id[ids[0]].ticket, DONE), (by_id[ids[1]].ticket, RETRY_NOW), (stale, DONE)]
    )
    assert written == {ids[0], ids[1]}
    assert store.get(ids[0]).state is State.DONE
    assert store.get(ids[1]).state is State.FAILED
    assert store.get(ids[2]).state is State.PROCESSING  # the fence held
    assert store.settle_many([(by_id[ids[0]].ticket, DONE)]) == set()  # terminal: never again
    abandon = Outcome(SettleKind.ABANDON, "abandoned")
    assert store.settle_many([(by_id[ids[2]].ticket, abandon)]) == set()
    assert store.get(ids[2]).state is State.PROCESSING


# -- the claim stays one index scan -----------------------------------------------------------

ROWS = 100_000
TOPICS = ["email.send", "report.daily", "image.resize"]
BASE = {"holder": "w1", "lease": LEASE, "limit": 16, "app_version": None}
STATEMENTS: dict[str, dict[str, Any]] = {
    "claim_topic": {"topic": "report.daily"},
    "claim_topics": {"topics": TOPICS},
    "claim_topic_limited": {"topic": "report.daily", "max_running": 3},
}


@pytest.fixture
def big_mixed_queue(pg: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """100,000 ready rows over three topics, priorities -2..7, a few processing; analyzed."""
    pg.execute(
        "INSERT INTO job (topic, payload, priority, available_at, state, locked_by, "
        "                 locked_until, attempts) "
        "SELECT (%s::text[])[1 + i %% 3], jsonb_build_object('i', i), (i %% 10) - 2, "
        "       now() - make_interval(secs => i / 100.0), "
        "       CASE WHEN i %% 1000 = 0 THEN 'processing' ELSE 'pending' END, "
        "       CASE WHEN i %% 1000 = 0 THEN 'w0' END, "
        "       CASE WHEN i %% 1000 = 0 THEN now() + interval '1 hour' END, "
        "       CASE WHEN i %% 1000 = 0 THEN 1 ELSE 0 END "
        "FROM generate_series(1, %s) AS i",
        (TOPICS, ROWS),
    )
    pg.execute("ANALYZE job")
    return pg


def _nodes(
    plan: dict[str, Any], above: tuple[dict[str, Any], ...] = ()
) -> Iterator[tuple[dict[str, Any], tuple[dict[str, Any], ...]]]:
    """Every plan node with the chain of its ancestors (nearest last)."""
    yield plan, above
    for child in plan.get("Plans", []):
        yield from _nodes(child, (*above, plan))


def check_claim_plan(plan: dict[str, Any], layout: Layout) -> None:
    """The claim scans job_claim_idx (each partition's part of it) in index order: no Seq Scan
    of job, no Sort over job."""

    def index(node: dict[str, Any]) -> str | None:
        name = node.get("Index Name")
        return layout.index_of.get(name, name) if name else None

    nodes = list(_nodes(plan))
    claim_scans = [(n, up) for n, up in nodes if index(n) == "job_claim_idx"]
    assert claim_scans, "the claim does not use job_claim_idx"
    for node, up in claim_scans:
        assert node["Node Type"] == "Index Scan", f"job_claim_idx not an Index Scan: {node}"
        # Nothing re-sorts the scan's rows before the Limit that takes the head.
        chain = list(reversed(up))
        limit_at = next((i for i, a in enumerate(chain) if a["Node Type"] == "Limit"), None)
        assert limit_at is not None, "no Limit above the claim scan"
        assert not any(a["Node Type"] in ("Sort", "Incremental Sort") for a in chain[:limit_at]), (
            "a Sort between the claim scan and its Limit"
        )
    for node, _ in nodes:
        if node.get("Relation Name") in layout.filled:
            assert node["Node Type"] != "Seq Scan", f"Seq Scan of job: {node}"
            if node["Node Type"] in ("Bitmap Heap Scan",):
                # Only the max_running count may use a bitmap, and only on the small index.
                assert "processing" in node.get("Recheck Cond", ""), node
        if node["Node Type"] in ("Sort", "Incremental Sort"):
            # A Sort may only order per-topic heads, each already cut by a Limit.
            for inner, up in _nodes(node):
                if inner.get("Relation Name") in layout.partitions and index(inner) == (
                    "job_claim_idx"
                ):
                    assert any(a["Node Type"] == "Limit" for a in up), f"Sort over job: {node}"
    counted = [n for n, _ in nodes if index(n) == "job_processing_idx"]
    if counted:
        assert all(
            n["Node Type"] in ("Index Only Scan", "Index Scan", "Bitmap Index Scan")
            for n in counted
        )


def explain(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    row = conn.execute(
        "EXPLAIN (FORMAT JSON) " + sql(name), {**BASE, **STATEMENTS[name]}
    ).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def generic_explain(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    """The generic plan a prepared statement gets after psycopg prepares it."""
    params = {**BASE, **STATEMENTS[name]}
    text = sql(name)
    names = [p for p in params if f"%({p})s" in text]
    for i, param in enumerate(names, start=1):
        text = text.replace(f"%({param})s", f"${i}")
    assert "%(" not in text
    conn.execute(f"PREPARE plan_{name} AS {text}")
    args = pgsql.SQL(", ").join(pgsql.Literal(params[p]) for p in names).as_string(conn)
    row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE plan_{name} ({args})").fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


@pytest.mark.timeout(60)
def test_every_claim_is_an_index_scan_with_100k_rows_and_mixed_priorities(
    big_mixed_queue: psycopg.Connection[Any],
) -> None:
    conn = big_mixed_queue
    for name in STATEMENTS:
        try:
            check_claim_plan(explain(conn, name), Layout(conn))
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
    conn.execute("SET plan_cache_mode = force_generic_plan")
    for name in STATEMENTS:
        try:
            check_claim_plan(generic_explain(conn, name), Layout(conn))
        except AssertionError as exc:
            raise AssertionError(f"{name} (generic plan): {exc}") from exc
    processing = conn.execute("SELECT count(*) FROM job WHERE state = 'processing'").fetchone()
    assert processing == (ROWS // 1000,), "EXPLAIN must not have claimed anything"


def test_the_claim_really_follows_the_plan_order(
    big_mixed_queue: psycopg.Connection[Any], dsn: str
) -> None:
    """On the big table, the claims come out highest priority first, oldest first."""
    store = PostgresStore(dsn)
    try:
        got: list[Claimed] = []
        for _ in range(5):
            claimed = store.claim("w1", ["report.daily"], LEASE, {"report.daily": 200})
            assert claimed is not None
            got.append(claimed)
    finally:
        store.close()
    rows = big_mixed_queue.execute(
        "SELECT priority, available_at FROM job WHERE id = ANY(%s::uuid[])", ([c.id for c in got],)
    ).fetchall()
    assert all(p == 7 for p, _ in rows)
    expected = big_mixed_queue.execute(
        "SELECT id::text FROM job WHERE topic = 'report.daily' AND priority = 7 "
        "AND state = 'pending' OR id = ANY(%s::uuid[]) ORDER BY available_at LIMIT 5",
        ([c.id for c in got],),
    ).fetchall()
    assert [c.id for c in got] == [r[0] for r in expected]
