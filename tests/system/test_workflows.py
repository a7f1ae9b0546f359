"""Workflows with real processes: a 3-level graph of 200 jobs run by two ``brooq supervise``
processes, one of them killed with SIGKILL mid-way; a failing parent under each policy; a
second workflow canceled (``brooq jobs cancel --workflow``) while its root runs.

Every run writes down (apps/sysapp_workflows.py, table ``wf_seen``) the states of its
parents as ``claim.parents`` read them when it started: no child may start before all its
parents ended, and one with ``if_parent_fails="cancel"`` only after they all ended done.
Effects (``wf_effect``, written in the settle transaction) happen once per job. Every
wait is bounded.
"""

from __future__ import annotations

import random
import signal
import time
from typing import Any

import psycopg
import pytest

from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Handle, Job, Workflow
from tests.system.harness import run_cli, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "sysapp_workflows:queue"
ARGS = ("--workers", "2", "--lease", "2s", "--poll-interval", "200ms", "--graceful-timeout", "3s")
ENV = {"QUEUE_REAPER_PERIOD": "1s"}
SLEEP = 0.1


def three_levels(seed: int = 26) -> tuple[Workflow, dict[str, Handle]]:
    """20 roots, 60 children of two roots each, 120 grandchildren of two children each (200).

    Root 0 fails. Child 0 (cancel, the default) waits for it alone, and grandchild 0 for
    child 0: both are canceled. Child 1 (``run``) waits for roots 0 and 1: it runs anyway,
    and grandchild 1 after it. The others wait for working jobs only.
    """
    rng = random.Random(seed)
    wf = Workflow()

    def step(n: int, **more: Any) -> Job:
        return Job("wf.step", {"n": n, "sleep": SLEEP, "effect": n % 2 == 0}, **more)

    roots = [wf.add(Job("wf.fail", {"n": 0}))]
    roots += [wf.add(step(n)) for n in range(1, 20)]
    kids = [wf.add(step(20), after=[roots[0]])]
    kids.append(wf.add(step(21, if_parent_fails="run"), after=[roots[0], roots[1]]))
    kids += [wf.add(step(20 + n), after=rng.sample(roots[1:], 2)) for n in range(2, 60)]
    grand = [wf.add(step(80), after=[kids[0]]), wf.add(step(81), after=[kids[1]])]
    grand += [wf.add(step(80 + n), after=rng.sample(kids[1:], 2)) for n in range(2, 120)]
    named = {"failing": roots[0], "canceled": kids[0], "canceled_too": grand[0], "runs": kids[1]}
    return wf, named


def states_of(pg: psycopg.Connection[Any], workflow_id: str) -> dict[str, int]:
    return dict(
        pg.execute(
            "SELECT state, count(*) FROM job WHERE workflow_id = %s GROUP BY state",
            (workflow_id,),
        ).fetchall()
    )


@pytest.mark.timeout(150)
def test_a_graph_runs_in_order_across_two_supervisors_one_killed(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Any
) -> None:
    started = time.monotonic()
    pg.execute("CREATE TABLE wf_seen (job_id uuid NOT NULL, parents jsonb NOT NULL)")
    pg.execute("CREATE TABLE wf_effect (job_id uuid PRIMARY KEY)")
    wf, named = three_levels()
    slow = Workflow()  # canceled while its root runs
    root = slow.add(Job("wf.step", {"n": -1, "sleep": 30}))
    chain = [slow.add(Job("wf.step", {"n": -2}), after=[root])]
    chain += [slow.add(Job("wf.step", {"n": -3 - n}), after=[chain[-1], root]) for n in range(9)]
    store = PostgresStore(dsn)
    try:
        store.enqueue_workflow(slow)
        written = store.enqueue_workflow(wf)
    finally:
        store.close()
    assert sum(e.state == "pending" for e in written) == 20  # the roots; the others wait
    doomed = supervise(*ARGS, app=APP, env=ENV, name="doomed")
    other = supervise(*ARGS, app=APP, env=ENV, name="other")

    # The slow workflow, canceled while its root runs: nothing after it ever starts.
    def started_once(job_id: str) -> bool:
        found = pg.execute("SELECT count(*) FROM wf_seen WHERE job_id = %s", (job_id,))
        return found.fetchone() == (1,)

    wait_until(lambda: started_once(root.id), 30, "the slow root to start")
    done = run_cli(dsn, tmp_path, "jobs", "cancel", "--workflow", slow.id, "--reason", "stop")
    assert done.returncode == 0 and done.stdout.strip() == "canceled 11 jobs", done
    assert states_of(pg, slow.id) == {"canceled": 11}

    # One supervisor dies mid-way (SIGKILL: its workers go with it, its leases run out).
    wait_until(lambda: states_of(pg, wf.id).get("done", 0) >= 40, 60, "40 jobs of the graph done")
    doomed.send(signal.SIGKILL)
    assert doomed.wait_exit(10) == -signal.SIGKILL
    mid = states_of(pg, wf.id)
    assert mid.get("done", 0) < 197 and mid.get("waiting", 0) > 0, mid

    final = wait_until(
        lambda: (s := states_of(pg, wf.id)).get("done", 0) == 197 and s,
        90,
        "the graph to finish on the other supervisor",
    )
    assert final == {"done": 197, "dead": 1, "canceled": 2}, final
    # The killed supervisor held jobs of the graph: their leases ran out, the other one's
    # reaper gave them back, and they ran again there.
    (expired,) = pg.execute(
        "SELECT count(*) FROM job WHERE workflow_id = %s AND expirations > 0", (wf.id,)
    ).fetchone() or (0,)
    assert expired > 0
    reasons = dict(
        pg.execute(
            "SELECT id::text, last_error FROM job WHERE workflow_id = %s AND state = 'canceled'",
            (wf.id,),
        ).fetchall()
    )
    assert reasons == {
        named["canceled"].id: f"canceled: parent {named['failing'].id} ended dead",
        named["canceled_too"].id: f"canceled: parent {named['canceled'].id} ended canceled",
    }

    # No child started before its parents ended; a cancel-policy child only after all done.
    policy = dict(pg.execute("SELECT id::text, if_parent_fails FROM job").fetchall())
    runs = pg.execute("SELECT job_id::text, parents FROM wf_seen").fetchall()
    for job_id, parents in runs:
        ends = set(parents.values())
        assert ends <= {"done", "dead", "canceled"}, (job_id, parents)
        if policy[job_id] == "cancel":
            assert ends == {"done"}, (job_id, parents)
    ran = {job_id for job_id, _ in runs}
    assert named["canceled"].id not in ran and named["canceled_too"].id not in ran
    (seen_by_runs,) = [p for j, p in runs if j == named["runs"].id][:1]
    assert seen_by_runs[named["failing"].id] == "dead"
    assert ran & {h.id for h in slow} == {root.id}  # the canceled workflow: only its root ran

    # Effects exactly once: a second insert would have failed its settle (primary key).
    effect_jobs = {h.id for h in wf if h.job.payload.get("effect")} - {
        named["canceled"].id,
        named["canceled_too"].id,
    }
    effects = {r[0] for r in pg.execute("SELECT job_id::text FROM wf_effect")}
    assert effects == effect_jobs
    results = pg.execute(
        "SELECT count(*) FROM job WHERE workflow_id = %s AND state = 'done' "
        "AND (result->>'n')::int = (payload->>'n')::int",
        (wf.id,),
    ).fetchone()
    assert results == (197,)
    assert pg.execute("SELECT count(*) FROM job_edge WHERE parent_state IS NULL").fetchone() == (0,)
    assert other.stop() == 0
    assert time.monotonic() - started < 90
