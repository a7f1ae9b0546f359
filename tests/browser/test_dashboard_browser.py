"""The dashboard in a real headless Chromium: counts, filters, a retry with the token, a refusal
without it, a ``<script>`` payload shown as text, and a screenshot of each page."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.dashboard_server import TOKEN, Served, serve_dashboard

pytestmark = pytest.mark.db

SCRIPT_PAYLOAD = '{"html": "<script>window.__pwned = 1</script>", "<b>": "</pre><i>x</i>"}'


def seed(pg: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """email.send: 3 done, 2 dead, 1 pending; report.build: 4 pending (no worker serves it)."""

    def insert(
        topic: str, state: str, n: int, payload: str = '{"n": 1}', error: str | None = None
    ) -> list[str]:
        rows = pg.execute(
            "INSERT INTO job (topic, payload, state, attempts, last_error, last_traceback) "
            "SELECT %s, %s::jsonb, %s, 2, %s, %s FROM generate_series(1, %s) "
            "RETURNING id::text",
            (
                topic,
                payload,
                state,
                error,
                'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: no'
                if error
                else None,
                n,
            ),
        ).fetchall()
        return [r[0] for r in rows]

    return {
        "done": insert("email.send", "done", 3),
        "dead": insert("email.send", "dead", 2, error="ValueError: no such address"),
        "pending": insert("email.send", "pending", 1) + insert("report.build", "pending", 4),
        "script": insert(
            "payload.test", "dead", 1, SCRIPT_PAYLOAD, error="<script>window.__pwned = 2</script>"
        ),
    }


@pytest.fixture
def guarded(dsn: str) -> Iterator[Served]:
    with serve_dashboard(dsn, TOKEN) as served:
        yield served


def wait_text(browser: webdriver.Chrome, element_id: str, text: str) -> None:
    """Wait until the page a click led to shows ``text`` in ``element_id`` (a click
    returns before the next page has loaded: reading at once may read the old one)."""
    WebDriverWait(browser, 10).until(ec.text_to_be_present_in_element((By.ID, element_id), text))


def log_in(browser: webdriver.Chrome, served: Served) -> None:
    """Log in with the token: with one configured, every page needs a session."""
    browser.get(f"{served.url}/ui/login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    wait_text(browser, "access", "actions enabled")


def shot(browser: webdriver.Chrome, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(path)), name
    assert path.stat().st_size > 1000
    return path


def cell(browser: webdriver.Chrome, topic: str, state: str) -> str:
    return browser.find_element(
        By.CSS_SELECTOR, f'#counts tr[data-topic="{topic}"] td[data-state="{state}"]'
    ).text


def state_of(pg: psycopg.Connection[Any], job_id: str) -> str:
    row = pg.execute("SELECT state FROM job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_overview_shows_the_seeded_counts(
    browser: webdriver.Chrome, guarded: Served, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    seed(pg)
    browser.get(f"{guarded.url}/")  # redirected to /ui, and without a session to the login
    assert "/ui/login" in browser.current_url
    assert not browser.find_elements(By.ID, "counts")
    log_in(browser, guarded)
    browser.get(f"{guarded.url}/")  # redirected to /ui
    assert browser.current_url.endswith("/ui")
    assert cell(browser, "email.send", "done") == "3"
    assert cell(browser, "email.send", "dead") == "2"
    assert cell(browser, "email.send", "pending") == "1"
    assert cell(browser, "report.build", "pending") == "4"
    assert cell(browser, "report.build", "done") == "0"
    unserved = browser.find_element(By.ID, "unserved").text
    assert "report.build" in unserved and "email.send" in unserved
    row = browser.find_element(By.CSS_SELECTOR, '#counts tr[data-topic="report.build"]')
    assert "unserved" in (row.get_attribute("class") or "")
    assert browser.find_element(By.ID, "chart").is_displayed()
    assert "no live supervisor" in browser.find_element(By.ID, "no-workers").text
    assert "actions enabled" in browser.find_element(By.ID, "access").text
    # Live refresh can be paused, and says so.
    browser.find_element(By.ID, "live-toggle").click()
    assert browser.find_element(By.ID, "live-state").text == "refresh paused"
    shot(browser, tmp_path, "overview")


def test_filtering_the_job_list(
    browser: webdriver.Chrome, guarded: Served, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    ids = seed(pg)
    log_in(browser, guarded)
    browser.get(f"{guarded.url}/ui/jobs")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")) == 11
    Select(browser.find_element(By.ID, "f-state")).select_by_value("dead")
    Select(browser.find_element(By.ID, "f-topic")).select_by_value("email.send")
    browser.find_element(By.ID, "f-apply").click()
    WebDriverWait(browser, 10).until(ec.url_contains("state=dead"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")
    assert sorted(r.get_attribute("data-id") or "" for r in rows) == sorted(ids["dead"])
    assert {r.get_attribute("data-state") for r in rows} == {"dead"}
    assert browser.find_element(By.ID, "total").text.startswith("2 jobs match")
    # Paging: one job per page, then the next page.
    browser.get(f"{guarded.url}/ui/jobs?state=pending&limit=3")
    first = [
        r.get_attribute("data-id")
        for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")
    ]
    old_page = browser.find_element(By.ID, "next")
    old_page.click()
    WebDriverWait(browser, 10).until(ec.staleness_of(old_page))
    second = [
        r.get_attribute("data-id")
        for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")
    ]
    assert len(first) == 3 and len(second) == 2 and not set(first) & set(second)
    browser.get(f"{guarded.url}/ui/jobs?state=dead&topic=email.send")
    shot(browser, tmp_path, "jobs")


def test_a_retry_through_the_page_with_the_token(
    browser: webdriver.Chrome, guarded: Served, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    ids = seed(pg)
    job = ids["dead"][0]
    browser.get(f"{guarded.url}/ui/login")
    shot(browser, tmp_path, "login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    wait_text(browser, "access", "actions enabled")
    browser.get(f"{guarded.url}/ui/jobs/{job}")
    assert browser.find_element(By.ID, "job-state").text == "dead"
    assert "ValueError: no such address" in browser.find_element(By.ID, "last-error").text
    assert "Traceback" in browser.find_element(By.ID, "traceback").text
    shot(browser, tmp_path, "job")
    browser.find_element(By.ID, "retry").click()
    wait_text(browser, "question", "Retry job")
    assert state_of(pg, job) == "dead"  # nothing changes before the confirmation
    shot(browser, tmp_path, "confirm")
    browser.find_element(By.ID, "confirm").click()
    WebDriverWait(browser, 10).until(
        ec.text_to_be_present_in_element((By.ID, "job-state"), "pending")
    )
    assert "retried" in browser.find_element(By.ID, "notice").text
    assert state_of(pg, job) == "pending"
    assert pg.execute("SELECT attempts FROM job WHERE id = %s", (job,)).fetchone() == (0,)
    # Bulk retry of the filtered dead jobs, confirmed.
    browser.get(f"{guarded.url}/ui/jobs?state=dead&topic=email.send")
    browser.find_element(By.ID, "bulk-retry").click()
    wait_text(browser, "question", "Retry 1 dead job")
    browser.find_element(By.ID, "confirm").click()
    WebDriverWait(browser, 10).until(
        ec.text_to_be_present_in_element((By.ID, "notice"), "retried 1 job")
    )
    assert {state_of(pg, j) for j in ids["dead"]} == {"pending"}


POST = """
const done = arguments[arguments.length - 1];
fetch(arguments[0], {method: "POST", credentials: "same-origin",
                     headers: {"Content-Type": "application/x-www-form-urlencoded"},
                     body: "confirm=yes"})
  .then(r => done(r.status), e => done(String(e)));
"""


def test_without_the_token_the_action_is_refused(
    browser: webdriver.Chrome, guarded: Served, dsn: str, pg: psycopg.Connection[Any]
) -> None:
    ids = seed(pg)
    job = ids["dead"][0]
    browser.get(f"{guarded.url}/ui/jobs/{job}")
    assert "/ui/login" in browser.current_url  # no session, no page
    assert not browser.find_elements(By.ID, "retry")
    status = browser.execute_async_script(POST, f"/ui/jobs/{job}/retry")
    assert status == 401
    assert state_of(pg, job) == "dead"
    with serve_dashboard(dsn, None) as read_only:
        browser.get(f"{read_only.url}/ui/jobs/{job}")
        assert "no BROOQ_TOKEN" in browser.find_element(By.ID, "access").text
        status = browser.execute_async_script(POST, f"/ui/jobs/{job}/retry")
        assert status == 403
    assert state_of(pg, job) == "dead"


def test_a_script_payload_is_shown_as_text(
    browser: webdriver.Chrome, guarded: Served, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    (job,) = seed(pg)["script"]
    log_in(browser, guarded)
    browser.get(f"{guarded.url}/ui/jobs/{job}")
    assert browser.execute_script("return window.__pwned === undefined")
    payload = browser.find_element(By.ID, "payload").text
    assert '"html": "<script>window.__pwned = 1</script>"' in payload
    assert '"<b>": "</pre><i>x</i>"' in payload
    assert browser.find_element(By.ID, "last-error").text == "<script>window.__pwned = 2</script>"
    assert not browser.find_elements(By.CSS_SELECTOR, "#payload i, #payload b")
    browser.get(f"{guarded.url}/ui/jobs?topic=payload.test")
    assert browser.execute_script("return window.__pwned === undefined")
    shot(browser, tmp_path, "script-payload")


def test_the_overview_refreshes_itself_until_paused(
    browser: webdriver.Chrome, guarded: Served, pg: psycopg.Connection[Any]
) -> None:
    seed(pg)
    log_in(browser, guarded)
    browser.get(f"{guarded.url}/ui")
    pg.execute("INSERT INTO job (topic, payload) VALUES ('late.topic', '{}')")
    WebDriverWait(browser, 12).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-topic="late.topic"]'))
    )
    browser.find_element(By.ID, "live-toggle").click()
    pg.execute("INSERT INTO job (topic, payload) VALUES ('paused.topic', '{}')")
    browser.implicitly_wait(0)
    WebDriverWait(browser, 8, poll_frequency=0.5).until_not(
        lambda b: "paused" not in b.find_element(By.ID, "live-state").text
    )
    time.sleep(6)  # longer than one refresh period
    assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-topic="paused.topic"]')
    browser.refresh()  # a paused page is still reloaded by hand, and stays paused
    assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-topic="paused.topic"]')
    assert browser.find_element(By.ID, "live-state").text == "refresh paused"
