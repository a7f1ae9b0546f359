"""The supervisor's routes over fake endpoints (no database): JSON shapes, the token guard,
what an outage may show, and the health board the loop publishes to.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any

import pytest

from brooq.surface import HealthBoard, Request, Router, ServiceEndpoints, service_routes
from brooq.surface.guard import FAILED_GUESSES_PER_CLIENT, GuessThrottle
from brooq.vocabulary import JobNotFound, StoreUnavailable

TOKEN = "service-test-token-0123456789abcdef"
JOB = "0190f5a2-0000-7000-8000-000000000001"
DB_TEXT = "database unavailable: connection to server at 10.1.2.3, user app_rw refused"


def call(
    router: Router, method: str, path: str, token: str | None = None, client: str = ""
) -> tuple[int, Any]:
    headers = (("authorization", f"Bearer {token}"),) if token else ()
    response = router.dispatch(Request(method, path, path, {}, headers, client=client))
    body = (
        json.loads(response.body) if response.content_type == "application/json" else response.body
    )
    return response.status, body


def routes(
    token: str | None = TOKEN,
    health: tuple[bool, str] = (True, "2 workers running"),
    failure: Exception | None = None,
    throttle: GuessThrottle | None = None,
) -> Router:
    def job(job_id: str) -> dict[str, Any]:
        if failure is not None:
            raise failure
        return {"id": job_id, "state": "pending"}

    def cancel(job_id: str) -> dict[str, Any]:
        if failure is not None:
            raise failure
        return {"id": job_id, "canceled": True, "state": "canceled"}

    return service_routes(
        Router(),
        ServiceEndpoints(
            metrics=lambda: b"# metrics\n",
            health=lambda: health,
            get_job=job,
            cancel_job=cancel,
            token=token,
            throttle=throttle,
        ),
    )


def test_healthz_and_metrics_keep_their_shapes() -> None:
    assert call(routes(), "GET", "/healthz") == (
        200,
        {"ok": True, "reason": "2 workers running", "paused": []},
    )
    assert call(routes(health=(False, "stopping (graceful)")), "GET", "/healthz") == (
        503,
        {"ok": False, "reason": "stopping (graceful)", "paused": []},
    )
    response = routes().dispatch(Request("GET", "/metrics", "/metrics", {}, ()))
    assert response.status == 200 and response.body == b"# metrics\n"
    assert response.content_type.startswith("text/plain; version=0.0.4")
    assert call(routes(), "GET", "/other")[0] == 404


def test_job_endpoints_need_the_token() -> None:
    router = routes()
    assert call(router, "GET", f"/jobs/{JOB}", TOKEN) == (200, {"id": JOB, "state": "pending"})
    assert call(router, "POST", f"/jobs/{JOB}/cancel", TOKEN) == (
        200,
        {"id": JOB, "canceled": True, "state": "canceled"},
    )
    for token in (None, "wrong"):
        assert call(router, "GET", f"/jobs/{JOB}", token)[0] == 401
        assert call(router, "POST", f"/jobs/{JOB}/cancel", token)[0] == 401
    assert call(router, "GET", f"/jobs/{JOB}/cancel", TOKEN)[0] == 405
    assert call(router, "GET", "/jobs/not-a-job-id!", TOKEN)[0] == 404


def test_wrong_bearer_tokens_are_logged_and_throttled_never_the_right_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 32, item 6: bearer-token guesses were neither throttled nor logged.
    throttle = GuessThrottle()
    router = routes(throttle=throttle)
    wrong = Request("GET", f"/jobs/{JOB}", f"/jobs/{JOB}", {}, (("authorization", "Bearer x"),))
    with caplog.at_level(logging.INFO, logger="brooq.surface"):
        answers = [router.dispatch(replace(wrong, client="10.0.0.1:5000")) for _ in range(7)]
        assert [a.status for a in answers] == [401] * FAILED_GUESSES_PER_CLIENT + [429] * 2
        assert int(dict(answers[-1].headers)["Retry-After"]) > 50
        assert call(router, "GET", f"/jobs/{JOB}", TOKEN, client="10.0.0.1:5001")[0] == 200
        assert call(router, "GET", f"/jobs/{JOB}", "x", client="10.0.0.2:5000")[0] == 401
        assert call(router, "GET", f"/jobs/{JOB}", None, client="10.0.0.1:5002")[0] == 401
    rejected = [r for r in caplog.records if getattr(r, "event", "") == "BearerTokenRejected"]
    assert [r.client for r in rejected].count("10.0.0.1") == FAILED_GUESSES_PER_CLIENT  # type: ignore[attr-defined]
    assert all(r.levelno == logging.WARNING and r.path == f"/jobs/{JOB}" for r in rejected)  # type: ignore[attr-defined]
    throttled = [r for r in caplog.records if getattr(r, "event", "") == "TokenGuessesThrottled"]
    assert len(throttled) == 1
    assert TOKEN not in caplog.text and "Bearer x" not in caplog.text


def test_without_a_token_the_job_endpoints_are_disabled() -> None:
    status, body = call(routes(token=None), "GET", f"/jobs/{JOB}", TOKEN)
    assert status == 404 and "disabled" in body["error"]
    status, body = call(routes(token=None), "POST", f"/jobs/{JOB}/cancel", TOKEN)
    assert status == 404 and "disabled" in body["error"]


def test_an_outage_shows_a_fixed_text_and_a_missing_job_is_404() -> None:
    status, body = call(routes(failure=StoreUnavailable(DB_TEXT)), "GET", f"/jobs/{JOB}", TOKEN)
    assert (status, body) == (503, {"error": "database unavailable"})
    status, body = call(
        routes(failure=JobNotFound(f"no job with id {JOB}")), "POST", f"/jobs/{JOB}/cancel", TOKEN
    )
    assert status == 404 and JOB in body["error"]


def test_the_health_board_reports_a_stalled_loop() -> None:
    board = HealthBoard(stale_after=0.2)
    assert board.read() == (False, "starting")
    board.publish(True, "4 workers running")
    assert board.read() == (True, "4 workers running")
    time.sleep(0.3)
    ok, reason = board.read()
    assert not ok and reason.startswith("supervisor loop stalled")


@pytest.mark.parametrize("reason", ["database unavailable", "1 of 2 workers running"])
def test_the_board_shows_what_the_loop_published(reason: str) -> None:
    board = HealthBoard()
    board.publish(False, reason)
    assert board.read() == (False, reason)


def test_readers_leave_the_time_they_asked() -> None:
    """The loop pings the database at its next tick only while someone asks."""
    board = HealthBoard()
    before = time.monotonic()
    assert not board.asked_since(before)
    board.read()
    assert board.asked_since(before)
    assert not board.asked_since(time.monotonic())
