"""What operators see and do with workflows: ``brooq job`` lists parents and children,
``brooq jobs … --workflow``, ``brooq jobs cancel --workflow ID``, ``--state waiting``, the
``waiting`` state in the metrics, and the dashboard's job page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.cli import main
from brooq.engine.outcome import DONE
from brooq.metrics import DatabaseCollector
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, Parent, State, Workflow
from tests.dashboard_server import serve_dashboard

pytestmark = pytest.mark.db

Run = Any


@pytest.fixture
def brooq(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, dsn: str
) -> Run:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", dsn)

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def store(dsn: str) -> Iterator[PostgresStore]:
    s = PostgresStore(dsn)
    yield s
    s.close()


def graph(store: PostgresStore) -> tuple[Workflow, str, str, str]:
    """A workflow a → b; a done; c (outside) after b. The workflow, then a, b, c."""
    wf = Workflow()
    a = wf.add(Job("etl.extract"))
    b = wf.add(Job("etl.load"), after=[a])
    store.enqueue_workflow(wf)
    claimed = store.claim("w1", ["etl.extract"], timedelta(minutes=1))
    assert claimed is not None and store.settle(claimed.ticket, DONE)
    (c,) = store.enqueue_many([Job("report.send", after=[b.id])])
    return wf, a.id, b.id, c.id


def test_brooq_job_lists_parents_and_children_with_their_states(
    brooq: Run, store: PostgresStore
) -> None:
    wf, a, b, c = graph(store)
    code, out, _ = brooq("job", b)
    assert code == 0
    lines = out.splitlines()
    assert any(line.split() == ["workflow_id", wf.id] for line in lines)
    assert any(line.split() == ["parents_left", "0"] for line in lines)
    at = lines.index("parents (1):")
    assert lines[at + 1].split() == [a, "done"]
    at = lines.index("children (1):")
    assert lines[at + 1].split() == [c, "waiting"]
    code, out, _ = brooq("job", b, "--json")
    shown = json.loads(out)
    assert shown["workflow_id"] == wf.id and shown["if_parent_fails"] == "cancel"
    assert shown["parents"] == [{"id": a, "state": "done"}] and shown["parents_total"] == 1
    assert shown["children"] == [{"id": c, "state": "waiting"}]
    _, out, _ = brooq("job", a)
    assert "parents" not in out and "if_parent_fails" not in out  # a root has neither


def test_jobs_commands_filter_by_workflow_and_by_waiting(brooq: Run, store: PostgresStore) -> None:
    wf, a, b, c = graph(store)
    code, out, _ = brooq("jobs", "list", "--workflow", wf.id, "--json")
    assert code == 0 and {r["id"] for r in json.loads(out)["jobs"]} == {a, b}
    _, out, _ = brooq("jobs", "list", "--state", "waiting", "--json")
    assert [r["id"] for r in json.loads(out)["jobs"]] == [c]
    code, _, err = brooq("jobs", "list", "--workflow", "nope")
    assert code == 2 and "not a workflow id" in err


def test_jobs_cancel_workflow_cancels_it_whole_in_one_statement(
    brooq: Run, store: PostgresStore, pg: psycopg.Connection[Any]
) -> None:
    wf, a, b, c = graph(store)
    code, out, _ = brooq("jobs", "cancel", "--workflow", wf.id, "--dry-run")
    assert code == 0 and out.strip() == "would have canceled 1 job (dry run: nothing changed)"
    code, _, err = brooq("jobs", "cancel", "--workflow", wf.id, "--topic", "etl.load")
    assert code == 2 and "takes no other filter" in err
    code, out, _ = brooq("jobs", "cancel", "--workflow", wf.id, "--reason", "bad input")
    assert code == 0 and out.strip() == "canceled 1 job"
    states = dict(pg.execute("SELECT id::text, state FROM job").fetchall())
    assert (states[a], states[b], states[c]) == ("done", "canceled", "canceled")
    (why,) = pg.execute("SELECT last_error FROM job WHERE id = %s", (b,)).fetchone() or ("",)
    assert why == "canceled: bad input"
    code, out, _ = brooq("jobs", "cancel", "--state", "waiting", "--topic", "report.send")
    assert code == 0 and out.strip() == "canceled 0 jobs"


def test_the_waiting_state_is_a_metric_series(store: PostgresStore, dsn: str) -> None:
    graph(store)
    inspection = PostgresInspection(dsn)
    try:
        gauges = DatabaseCollector(inspection, ["report.send", "idle.topic"])
        families = {f.name: f for f in gauges.collect()}
        samples = {
            (s.labels["topic"], s.labels["state"]): s.value for s in families["brooq_jobs"].samples
        }
    finally:
        inspection.close()
    assert samples[("report.send", "waiting")] == 1
    assert samples[("etl.load", "pending")] == 1  # its parent is done
    assert samples[("idle.topic", "waiting")] == 0  # every state of a topic served, from zero


def test_the_dashboard_job_page_lists_parents_and_children(dsn: str, store: PostgresStore) -> None:
    wf, a, b, c = graph(store)
    with serve_dashboard(dsn, None) as served:
        page = served.request("GET", f"/ui/jobs/{b}")
        assert page.status == 200
        body = page.body
        assert 'id="parents"' in body and 'id="children"' in body
        assert f'data-id="{a}" data-state="done"' in body
        assert f'data-id="{c}" data-state="waiting"' in body
        assert f'href="/ui/jobs?workflow={wf.id}"' in body
        waiting = served.request("GET", f"/ui/jobs/{c}")
        assert 'id="parents-left"' in waiting.body and "Cancel" in waiting.body
        listed = served.request("GET", f"/ui/jobs?workflow={wf.id}")
        assert listed.status == 200 and a in listed.body and c not in listed.body
        listed = served.request("GET", "/ui/jobs?state=waiting")
        assert c in listed.body and b not in listed.body


def test_brooq_enqueue_after_parents(brooq: Run, store: PostgresStore) -> None:
    (parent,) = store.enqueue_many([Job("etl.extract")])
    code, out, _ = brooq(
        "enqueue", "--topic", "report.send", "--payload", "{}", "--after", parent.id
    )
    assert code == 0 and json.loads(out)["state"] == "waiting"
    child = json.loads(out)["id"]
    code, out, _ = brooq(
        "enqueue",
        "--topic",
        "report.send",
        "--payload",
        "{}",
        "--after",
        "01900000-0000-7000-8000-000000000009",
        "--if-parent-fails",
        "run",
    )
    # A parent it cannot see may not be committed yet: it waits (the reaper decides later).
    assert code == 0 and json.loads(out)["state"] == "waiting"
    code, _, err = brooq("enqueue", "--topic", "t", "--payload", "{}", "--after", "nope")
    assert code == 2 and "not a job id" in err
    assert store.parents(child) == {parent.id: Parent(State.PENDING)}
