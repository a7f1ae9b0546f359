"""Issue 22, items 6 and 7, on a real supervisor: with BROOQ_TOKEN (and so with
``--http-allow-remote``) every page needs the login; a Host that names another
server (DNS rebinding) is answered 421 but on /healthz and /metrics; each
login is a session of its own, Secure with remote access, ended by logout."""

from __future__ import annotations

import http.client
import re
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from tests.system.harness import free_port, insert_jobs, wait_until
from tests.system.obs_helpers import http_addr
from tests.system.test_slowloris import timed_healthz

pytestmark = [pytest.mark.system, pytest.mark.db]

TOKEN = "access-test-token-0123456789abcdef"


def call(
    port: int, method: str, path: str, headers: dict[str, str], form: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one request to 127.0.0.1:``port``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    body = urlencode(form).encode() if form is not None else None
    sent = dict(headers)
    if form is not None:
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


@pytest.mark.timeout(90)
def test_with_remote_access_every_page_needs_a_session_and_this_server_s_name(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    (job,) = insert_jobs(pg, "unserved.topic", [{"n": 1}])
    port = free_port()
    sup = supervise(
        "--workers",
        "1",
        "--http-addr",
        f"0.0.0.0:{port}",
        "--http-allow-remote",
        env={"BROOQ_TOKEN": TOKEN},
    )
    assert http_addr(sup) == f"0.0.0.0:{port}"
    wait_until(lambda: timed_healthz("127.0.0.1", port)[1] == 200, 20, "/healthz 200")
    here = {"Host": f"127.0.0.1:{port}"}

    for path in ("/ui", "/ui/jobs", f"/ui/jobs/{job}"):
        status, headers, body = call(port, "GET", path, here)
        assert status == 303 and headers["Location"].startswith("/ui/login"), path
        assert "unserved.topic" not in body

    rebound = {"Host": f"rebind.example:{port}"}
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert call(port, "GET", "/ui/jobs", {**rebound, **bearer})[0] == 421
    assert call(port, "GET", f"/jobs/{job}", {**rebound, **bearer})[0] == 421
    assert call(port, "POST", "/ui/login", rebound, {"token": TOKEN})[0] == 421
    assert call(port, "GET", "/healthz", rebound)[0] == 200
    assert call(port, "GET", "/metrics", rebound)[0] == 200
    assert call(port, "GET", f"/jobs/{job}", {**here, **bearer})[0] == 200

    logins = [call(port, "POST", "/ui/login", here, {"token": TOKEN}) for _ in range(2)]
    cookies = [headers["Set-Cookie"] for _, headers, _ in logins]
    assert all(c.endswith("; Secure") and TOKEN not in c for c in cookies)
    assert cookies[0].split(";")[0] != cookies[1].split(";")[0]
    session = {**here, "Cookie": cookies[0].split(";")[0]}
    status, _, page = call(port, "GET", f"/ui/jobs/{job}", session)
    assert status == 200 and "unserved.topic" in page
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None
    assert call(port, "POST", "/ui/logout", session, {"csrf": csrf[1]})[0] == 303
    assert call(port, "GET", f"/ui/jobs/{job}", session)[0] == 303  # that session is over
    other = {**here, "Cookie": cookies[1].split(";")[0]}
    assert call(port, "GET", f"/ui/jobs/{job}", other)[0] == 200  # the other one is not
    assert sup.stop() == 0
