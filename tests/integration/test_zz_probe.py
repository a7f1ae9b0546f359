import threading
from datetime import timedelta
import psycopg, pytest
import brooq
from brooq import Job
from brooq.postgres.store import PostgresStore
from tests.integration.helpers import run_one


def test_hook_query_canceled(pg_store, pg):
    (job,) = pg_store.enqueue_many([Job("work")])
    def handler(claim):
        def hook(conn):
            conn.execute("SET LOCAL statement_timeout = '10ms'")
            conn.execute("SELECT pg_sleep(1)")
        claim.on_succeeded(hook)
    try:
        a = run_one(pg_store, handler)
        print("attempted", a.outcome, a.written)
    except Exception as e:
        print("RAISED", type(e).__name__, e)
    print(pg_store.get(job.id))


def test_hook_reenters_queue(dsn):
    q = brooq.Queue(dsn)
    q.enqueue(Job("work"))
    @q.kind("work")
    def h(claim):
        claim.on_succeeded(lambda conn: q.enqueue(Job("follow")))
    t = threading.Thread(target=q.drain, daemon=True)
    t.start(); t.join(5)
    print("DRAIN ALIVE (deadlock)?", t.is_alive())


def test_terminated_connection(pg_store, pg):
    pg_store.enqueue_many([Job("work")])
    pid = pg.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    print("pids", pid)
    for (p,) in pid:
        pg.execute("SELECT pg_terminate_backend(%s)", (p,))
    import time; time.sleep(0.2)
    try:
        print(pg_store.claim("w", ["work"], timedelta(seconds=30)))
    except Exception as e:
        print("RAISED", type(e).__name__, e)
    print("second", pg_store.claim("w", ["work"], timedelta(seconds=30)))


def test_given_connection(dsn, pg):
    conn = psycopg.connect(dsn)
    q = brooq.Queue(conn)
    a = q.enqueue(Job("work"))
    print("after first enqueue visible:", pg.execute("select count(*) from job").fetchone())
    q.get(a.id)
    b = q.enqueue(Job("work"))
    print("after get+enqueue visible:", pg.execute("select count(*) from job").fetchone(), conn.info.transaction_status)
    q.cancel(a.id)
    print("cancel visible:", pg.execute("select state from job where id=%s", (a.id,)).fetchone())
    conn.close()
    print("after close:", pg.execute("select count(*) from job").fetchone())


def test_rr_conflict(dsn, pg):
    q = brooq.Queue(dsn)
    with psycopg.connect(dsn) as b:
        b.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        b.execute("SELECT 1")
        q.enqueue(Job("work", idempotency_key="k"))
        try:
            print(q.enqueue(Job("work", idempotency_key="k"), conn=b))
        except Exception as e:
            print("RAISED", type(e).__mro__[:4], e)


def test_cancel_nul_reason(dsn):
    q = brooq.Queue(dsn)
    i, _ = q.enqueue(Job("work"))
    try:
        q.cancel(i, reason="a\x00b")
    except Exception as e:
        print("RAISED", type(e).__name__, e)
