"""Backend CPU per claim: brooq's claim_topic against the floor claim (prototype)."""
import os, sys, time, json
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import psycopg
from brooq.postgres.sql import sql

# A scratch database migrated with `brooq migrate up` (never one that matters: it truncates job).
DSN = os.environ["PROTO_DSN"]
FLOOR = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "001-floor-claim-prototype.sql")).read()
TICK = os.sysconf("SC_CLK_TCK")
NIL = "00000000-0000-0000-0000-000000000000"

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

LOAD = """INSERT INTO job (id, topic, payload, available_at)
SELECT encode(substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              || substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid,
       'bench', jsonb_build_object('i', i), now() - interval '1 minute' + i * interval '1 microsecond'
FROM generate_series(1, %(n)s) AS i"""

def load(conn, n):
    conn.execute(LOAD, {"n": n})
    conn.execute("VACUUM ANALYZE job")

class Floor:
    def __init__(self):
        self.levels = {0: ("-infinity", NIL)}
        self.xmax, self.xip = None, []
    def params(self):
        ps = sorted(self.levels)
        return {"lp": ps, "lat": [self.levels[p][0] for p in ps], "lid": [self.levels[p][1] for p in ps],
                "xmax": self.xmax or "0", "xend": "9223372036854775807", "xip": self.xip}
    def update(self, snap, levels, rows):
        xmin, xmax, xip = snap.split(":")
        self.xmax, self.xip = xmax, [x for x in xip.split(",") if x]
        for p, at, id_ in levels or []:
            self.levels[p] = (at, id_)
        for id_, p, at, _ in rows or []:
            cur = self.levels.get(p)
            if cur is None or (at, id_) > cur:   # ISO strings of one zone compare as times
                self.levels[p] = (at, id_)

def run(conn, kind, claims, limit, state):
    pid = conn.info.backend_pid
    got = 0
    c0, w0 = cpu(pid), time.perf_counter()
    for _ in range(claims):
        if kind == "A":
            rows = conn.execute(sql("claim_topic"), {"topic": "bench", "limit": limit, "holder": "h",
                                                     "lease": "30 seconds", "app_version": None},
                                prepare=True).fetchall()
            got += len(rows)
        else:
            p = {"topic": "bench", "limit": limit, "holder": "h", "app_version": None, "recent": state["recent"]}
            p.update(state["floor"].params())
            snap, levels, rows = conn.execute(FLOOR, p, prepare=True).fetchone()
            state["floor"].update(snap, levels, rows)
            got += len(rows or [])
    return (cpu(pid) - c0) / claims * 1000, (time.perf_counter() - w0) / claims * 1000, got

if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "quiet"
    claims = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        if os.environ.get("PCM"):  # e.g. force_generic_plan
            conn.execute(f"SET plan_cache_mode = {os.environ['PCM']}")
        conn.execute("DELETE FROM job WHERE topic = 'bench'")
        load(conn, 60_000)
        recent = conn.execute("SELECT encode(substring(int8send(((extract(epoch FROM now()) - 3600) * 1000)::bigint) FROM 3) || '\\x00000000000000000000'::bytea, 'hex')::uuid::text").fetchone()[0]
        state = {"floor": Floor(), "recent": recent}
        holder = None
        if mode == "held":
            holder = psycopg.connect(DSN)
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM job WHERE topic = 'x'")
        for rnd in range(3):
            for kind in ("A", "B"):
                c, w, got = run(conn, kind, claims, 8, state)
                print(f"{mode} round {rnd} {kind}: cpu {c:.3f} ms/claim, wall {w:.3f} ms, got {got}", flush=True)
                if mode == "quiet":
                    conn.execute("VACUUM job")
        if holder:
            holder.close()
