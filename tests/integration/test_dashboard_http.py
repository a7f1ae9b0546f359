"""The dashboard over HTTP (no browser): pages, redirects, escaping, and who may act.

Actions need the token: refused 403 when none is configured (read-only),
401 without a session, 403 with a cookie but no CSRF token or from another
origin; the login cookie is HttpOnly and SameSite=Strict.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import psycopg
import pytest

from tests.dashboard_server import TOKEN, Served, serve_dashboard
from tests.system.harness import PYTHONPATH, free_port

pytestmark = pytest.mark.db


@pytest.fixture
def guarded(dsn: str) -> Iterator[Served]:
    with serve_dashboard(dsn, TOKEN) as served:
        yield served


@pytest.fixture
def read_only(dsn: str) -> Iterator[Served]:
    with serve_dashboard(dsn, None) as served:
        yield served


def insert(
    pg: psycopg.Connection[Any],
    topic: str,
    state: str,
    payload: str = "{}",
    error: str | None = None,
) -> str:
    locked = "'h:1:x', now() + interval '1 minute'" if state == "processing" else "NULL, NULL"
    row = pg.execute(
        "INSERT INTO job (topic, payload, state, attempts, last_error, locked_by, locked_until) "
        f"VALUES (%s, %s::jsonb, %s, 2, %s, {locked}) RETURNING id::text",
        (topic, payload, state, error),
    ).fetchone()
    assert row is not None
    return str(row[0])


def state_of(pg: psycopg.Connection[Any], job_id: str) -> str | None:
    row = pg.execute("SELECT state FROM job WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def login(served: Served) -> str:
    answer = served.request("POST", "/ui/login", {"token": TOKEN})
    assert answer.status == 303
    cookie = answer.headers["Set-Cookie"]
    return cookie.split(";")[0]


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, "no CSRF field on the page"
    return match[1]


def test_root_redirects_to_ui_and_pages_answer(
    read_only: Served, pg: psycopg.Connection[Any]
) -> None:
    job = insert(pg, "email.send", "dead", error="ValueError: boom")
    answer = read_only.request("GET", "/")
    assert answer.status == 303 and answer.headers["Location"] == "/ui"
    overview = read_only.request("GET", "/ui")
    assert overview.status == 200 and "email.send" in overview.body
    assert "read-only: no BROOQ_TOKEN configured" in overview.body
    assert "default-src 'none'" in overview.headers["Content-Security-Policy"]
    listing = read_only.request("GET", "/ui/jobs?state=dead")
    assert listing.status == 200 and job in listing.body and "ValueError: boom" in listing.body
    page = read_only.request("GET", f"/ui/jobs/{job}")
    assert page.status == 200 and "ValueError: boom" in page.body
    assert read_only.request("GET", "/ui/jobs/0190f4c4-7a55-7c1e-8f00-00000000beef").status == 404
    assert read_only.request("GET", "/ui/jobs?since=yesterday").status == 400
    css = read_only.request("GET", "/ui/static/dashboard.css")
    assert css.status == 200 and css.headers["Content-Type"].startswith("text/css")
    assert read_only.request("GET", "/ui/static/dashboard.js").status == 200


def test_the_overview_shows_the_rate_limits(read_only: Served, pg: psycopg.Connection[Any]) -> None:
    assert 'id="rates"' not in read_only.request("GET", "/ui").body  # none: no section
    pg.execute(
        "INSERT INTO brooq_rate_limit (topic, key, rate, per, burst, full_at) VALUES "
        "('api.call', '', 20, '1 second', 5, clock_timestamp() + interval '1 hour'), "
        "('api.call', 'tenant-1', 20, '1 second', 5, clock_timestamp() + interval '1 hour')"
    )
    body = read_only.request("GET", "/ui").body
    rates = body[body.index('id="rates"') :]
    rates = rates[: rates.index("</table>")]
    assert 'data-topic="api.call"' in rates and ">20/s<" in rates and 'data-tokens="0.0"' in rates
    assert rates.count('<td class="num">1</td>') == 2  # one key in use, one waiting


def test_no_asset_comes_from_elsewhere(read_only: Served, pg: psycopg.Connection[Any]) -> None:
    job = insert(pg, "email.send", "dead")
    for path in ("/ui", "/ui/jobs", f"/ui/jobs/{job}", "/ui/login"):
        html = read_only.request("GET", path).body
        assert not re.search(r'(src|href)="(https?:)?//', html), path


def test_a_script_payload_is_text(read_only: Served, pg: psycopg.Connection[Any]) -> None:
    evil = '{"note": "</pre><script>alert(1)</script>", "<img src=x onerror=alert(2)>": 1}'
    job = insert(pg, "email.send", "dead", evil, error="<script>alert(3)</script>")
    for path in (f"/ui/jobs/{job}", "/ui/jobs", "/ui"):
        html = read_only.request("GET", path).body
        assert "<script>alert" not in html and "<img src=x" not in html, path
    page = read_only.request("GET", f"/ui/jobs/{job}").body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in page


def test_read_only_refuses_every_action_with_403(
    read_only: Served, pg: psycopg.Connection[Any]
) -> None:
    dead = insert(pg, "email.send", "dead")
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path, form in (
        (f"/ui/jobs/{dead}/retry", {"confirm": "yes"}),
        (f"/ui/jobs/{dead}/cancel", {"confirm": "yes"}),
        ("/ui/jobs/retry", {"state": "dead", "confirm": "yes"}),
        ("/ui/jobs/purge", {"state": "dead", "confirm": "yes"}),
    ):
        answer = read_only.request("POST", path, form, bearer)
        assert answer.status == 403 and "read-only" in answer.body, path
    assert state_of(pg, dead) == "dead"


def test_without_a_session_actions_are_401(guarded: Served, pg: psycopg.Connection[Any]) -> None:
    dead = insert(pg, "email.send", "dead")
    answer = guarded.request("POST", f"/ui/jobs/{dead}/retry", {"confirm": "yes"})
    assert answer.status == 401
    wrong = guarded.request(
        "POST",
        f"/ui/jobs/{dead}/retry",
        {"confirm": "yes"},
        {"Authorization": "Bearer not-the-token"},
    )
    assert wrong.status == 401
    assert guarded.request("POST", "/ui/login", {"token": "nope"}).status == 401
    assert state_of(pg, dead) == "dead"


def test_login_cookie_is_httponly_strict_and_never_the_token(guarded: Served) -> None:
    answer = guarded.request("POST", "/ui/login", {"token": TOKEN})
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    assert TOKEN not in cookie and "Secure" not in cookie  # plain HTTP on loopback
    behind_tls = guarded.request(
        "POST", "/ui/login", {"token": TOKEN}, {"X-Forwarded-Proto": "https"}
    )
    assert behind_tls.headers["Set-Cookie"].endswith("; Secure")


def test_with_a_token_every_page_needs_the_login(
    guarded: Served, pg: psycopg.Connection[Any]
) -> None:
    # Issue 22, item 6: reads too, as GET /jobs/<id> already did.
    job = insert(pg, "email.send", "dead", error="ValueError: secret detail")
    for path in ("/ui", "/ui/jobs", f"/ui/jobs/{job}", "/ui/jobs?state=dead"):
        answer = guarded.request("GET", path)
        assert answer.status == 303, path
        assert answer.headers["Location"].startswith("/ui/login?"), path
        assert "email.send" not in answer.body and "secret detail" not in answer.body
    assert guarded.request("GET", "/ui/login").status == 200
    assert guarded.request("GET", "/ui/static/dashboard.css").status == 200
    bearer = guarded.request("GET", f"/ui/jobs/{job}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status == 200 and "secret detail" in bearer.body
    cookie = {"Cookie": login(guarded)}
    page = guarded.request("GET", f"/ui/jobs/{job}", headers=cookie)
    assert page.status == 200 and "secret detail" in page.body


def test_logout_ends_the_session_and_needs_its_csrf_token(guarded: Served) -> None:
    # Issue 22, item 7: the cookie was a fixed HMAC of the token, valid after logout.
    cookie = {"Cookie": login(guarded)}
    assert login(guarded) != cookie["Cookie"]  # every login its own session
    csrf = csrf_of(guarded.request("GET", "/ui", headers=cookie).body)
    refused = guarded.request("POST", "/ui/logout", {}, cookie)
    assert refused.status == 403 and guarded.request("GET", "/ui", headers=cookie).status == 200
    logout = guarded.request("POST", "/ui/logout", {"csrf": csrf}, cookie)
    assert logout.status == 303 and "Max-Age=0" in logout.headers["Set-Cookie"]
    assert guarded.request("GET", "/ui", headers=cookie).status == 303  # to the login again
    replayed = guarded.request("POST", "/ui/jobs/purge", {"state": "dead", "csrf": csrf}, cookie)
    assert replayed.status == 401


def test_no_page_of_another_site_and_no_guesser_locks_the_operator_out(guarded: Served) -> None:
    # Issue 32, item 6: five wrong tokens posted from any page (no Origin check on the
    # login) got the right token a 429 for 60 s.
    evil = {"Origin": "http://evil.example"}
    for _ in range(8):
        answer = guarded.request("POST", "/ui/login", {"token": "guess"}, evil)
        assert answer.status == 403 and "another site" in answer.body
    refused = guarded.request("POST", "/ui/login", {"token": TOKEN}, evil)
    assert refused.status == 403 and "Set-Cookie" not in refused.headers
    referer = {"Referer": "http://evil.example/page"}
    assert guarded.request("POST", "/ui/login", {"token": "guess"}, referer).status == 403
    # None of them counted: the operator logs in at once, from this page.
    assert login(guarded)
    # Guesses from the operator's own address (a shared proxy, loopback) are throttled,
    # yet the right token still logs in.
    same = {"Origin": guarded.url}
    statuses = [guarded.request("POST", "/ui/login", {"token": "guess"}, same).status]
    statuses += [guarded.request("POST", "/ui/login", {"token": "guess"}).status for _ in range(6)]
    assert statuses == [401] * 5 + [429] * 2
    throttled = guarded.request("POST", "/ui/login", {"token": "guess"})
    assert throttled.status == 429 and int(throttled.headers["Retry-After"]) > 0
    assert login(guarded)
    # Wrong bearer tokens count against the same address: 429, the right one still reads.
    wrong = guarded.request("GET", "/ui/jobs", headers={"Authorization": "Bearer guess"})
    assert wrong.status == 429 and int(wrong.headers["Retry-After"]) > 0
    right = guarded.request("GET", "/ui/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status == 200


def test_a_host_that_names_another_server_is_421(guarded: Served, dsn: str) -> None:
    # Issue 22, item 6: DNS rebinding sends the attacker's name as Host.
    port = guarded.address.rsplit(":", 1)[1]
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for host in ("rebind.example", f"rebind.example:{port}", "127.0.0.2", "bad host"):
        answer = guarded.request("GET", "/ui/jobs", headers={**bearer, "Host": host})
        assert answer.status == 421, host
        login_page = guarded.request("GET", "/ui/login", headers={"Host": host})
        assert login_page.status == 421, host
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1"):
        assert guarded.request("GET", "/ui/jobs", headers={**bearer, "Host": host}).status == 200
    with serve_dashboard(dsn, TOKEN, allowed_hosts=("brooq.internal",)) as named:
        answer = named.request("GET", "/ui/jobs", headers={**bearer, "Host": "brooq.internal"})
        assert answer.status == 200


def test_a_cookie_session_needs_the_csrf_token_and_the_same_origin(
    guarded: Served, pg: psycopg.Connection[Any]
) -> None:
    dead = insert(pg, "email.send", "dead")
    cookie = {"Cookie": login(guarded)}
    no_csrf = guarded.request("POST", f"/ui/jobs/{dead}/retry", {"confirm": "yes"}, cookie)
    assert no_csrf.status == 403 and "CSRF" in no_csrf.body
    page = guarded.request("GET", f"/ui/jobs/{dead}", headers=cookie).body
    csrf = csrf_of(page)
    foreign = guarded.request(
        "POST",
        f"/ui/jobs/{dead}/retry",
        {"confirm": "yes", "csrf": csrf},
        {**cookie, "Origin": "http://evil.example"},
    )
    assert foreign.status == 403
    assert state_of(pg, dead) == "dead"
    # The first post asks for confirmation; the confirmed one retries.
    asked = guarded.request("POST", f"/ui/jobs/{dead}/retry", {"csrf": csrf}, cookie)
    assert asked.status == 200 and "Retry job" in asked.body and state_of(pg, dead) == "dead"
    done = guarded.request(
        "POST",
        f"/ui/jobs/{dead}/retry",
        {"csrf": csrf, "confirm": "yes"},
        {**cookie, "Origin": guarded.url},
    )
    assert done.status == 303 and state_of(pg, dead) == "pending"


def test_retry_from_the_page_never_touches_a_live_row(
    guarded: Served, pg: psycopg.Connection[Any]
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for state in ("pending", "failed", "processing", "done"):
        job = insert(pg, "email.send", state)
        answer = guarded.request("POST", f"/ui/jobs/{job}/retry", {"confirm": "yes"}, bearer)
        assert answer.status == 303
        assert "only dead or canceled" in unquote_plus(answer.headers["Location"])
        assert state_of(pg, job) == state


def test_bulk_retry_and_purge_follow_the_filter_and_the_guards(
    guarded: Served, pg: psycopg.Connection[Any]
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    dead = [insert(pg, "email.send", "dead") for _ in range(3)]
    other = insert(pg, "report.build", "dead")
    live = insert(pg, "email.send", "pending")
    asked = guarded.request(
        "POST", "/ui/jobs/retry", {"state": "dead", "topic": "email.send"}, bearer
    )
    assert asked.status == 200 and "Retry 3 dead jobs" in asked.body
    done = guarded.request(
        "POST", "/ui/jobs/retry", {"state": "dead", "topic": "email.send", "confirm": "yes"}, bearer
    )
    assert done.status == 303 and "retried+3+jobs" in done.headers["Location"]
    assert {state_of(pg, j) for j in dead} == {"pending"} and state_of(pg, other) == "dead"
    refused = guarded.request(
        "POST", "/ui/jobs/purge", {"state": "pending", "confirm": "yes"}, bearer
    )
    assert refused.status == 400
    purged = guarded.request("POST", "/ui/jobs/purge", {"state": "dead", "confirm": "yes"}, bearer)
    assert purged.status == 303 and state_of(pg, other) is None
    assert state_of(pg, live) == "pending" and {state_of(pg, j) for j in dead} == {"pending"}


def test_cancel_from_the_page(guarded: Served, pg: psycopg.Connection[Any]) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    job = insert(pg, "email.send", "pending")
    answer = guarded.request("POST", f"/ui/jobs/{job}/cancel", {"confirm": "yes"}, bearer)
    assert answer.status == 303 and state_of(pg, job) == "canceled"


def test_brooq_dashboard_serves_alone_and_stops_on_sigterm(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    insert(pg, "email.send", "dead")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "BROOQ_", "HTTP_"))}
    env.update({"DATABASE_URL": dsn, "PYTHONPATH": PYTHONPATH})
    proc = subprocess.Popen(
        [sys.executable, "-m", "brooq.cli", "dashboard", "--http-addr", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/ui" in line and "read-only" in line
        served = Served(f"127.0.0.1:{port}")
        page = served.request("GET", "/ui")
        assert page.status == 200 and "email.send" in page.body
        assert "served by the brooq dashboard" in page.body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_job_page_shows_the_result_escaped_and_cuts_a_large_one(
    read_only: Served, pg: psycopg.Connection[Any]
) -> None:
    job = insert(pg, "report", "done")
    pg.execute(
        "UPDATE job SET result = %s::jsonb WHERE id = %s",
        ('{"html": "<script>alert(1)</script>"}', job),
    )
    page = read_only.request("GET", f"/ui/jobs/{job}")
    assert page.status == 200 and 'id="result"' in page.body
    assert "<script>alert(1)" not in page.body and "&lt;script&gt;alert(1)" in page.body
    big = insert(pg, "report", "done")
    pg.execute("UPDATE job SET result = to_jsonb(repeat('x', 100000)) WHERE id = %s", (big,))
    page = read_only.request("GET", f"/ui/jobs/{big}")
    assert page.status == 200 and "cut: the result is 100002 bytes of JSON" in page.body
    assert len(page.body) < 60_000


def test_the_job_page_shows_a_jobs_own_options_and_trace_context(
    read_only: Served, pg: psycopg.Connection[Any]
) -> None:
    job = insert(pg, "email.send", "pending")
    page = read_only.request("GET", f"/ui/jobs/{job}").body
    assert 'id="max-attempts"' not in page and 'id="trace-context"' not in page
    pg.execute(
        "UPDATE job SET max_attempts = 20, max_execution_timeout = '90 seconds', "
        "backoff_base = '0.5 seconds', trace_context = %s WHERE id = %s",
        ('{"traceparent": "00-<x>-01"}', job),
    )
    page = read_only.request("GET", f"/ui/jobs/{job}").body
    assert 'id="max-attempts">20<' in page
    assert 'id="max-execution-timeout">1m30s<' in page and 'id="backoff-base">500ms<' in page
    assert 'id="attempt-timeout"' not in page  # the kind's option holds
    assert "traceparent: 00-&lt;x&gt;-01" in page
