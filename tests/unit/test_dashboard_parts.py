"""The dashboard's pure parts: who may act (session, CSRF, origin), the redirect that never
leaves /ui, the query-string filter, the chart's geometry, and autoescaped templates."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from brooq.engine.inspection import MinuteCount
from brooq.surface.dashboard.access import (
    COOKIE,
    Access,
    Sessions,
    Verdict,
    same_origin,
)
from brooq.surface.dashboard.forms import query_filter, redirect
from brooq.surface.dashboard.render import chart, environment, page
from brooq.surface.guard import FAILED_GUESSES_PER_CLIENT
from brooq.surface.wire import Request
from brooq.vocabulary import InvalidInput, State

TOKEN = "s3cret-token-of-the-operator-0123456789"


def request(
    headers: list[tuple[str, str]] | None = None, client: str = "10.0.0.1:50000"
) -> Request:
    return Request(
        method="POST",
        target="/ui/x",
        path="/ui/x",
        query={},
        headers=tuple(headers or [("host", "127.0.0.1:8090")]),
        client=client,
    )


def logged_in(access: Access, *headers: tuple[str, str]) -> tuple[tuple[str, str], str]:
    """Log in with the token: the Cookie header to send, and the session's CSRF token."""
    answer = access.login(request(list(headers) or None), TOKEN)
    assert answer.cookie is not None and answer.status == 303
    cookie = ("cookie", answer.cookie.split(";")[0])
    return cookie, access.csrf_for(request([cookie]))


def test_each_login_gets_a_session_of_its_own_never_the_token() -> None:
    # Issue 22, item 7: the cookie was a fixed HMAC of the token, the same for every login.
    access = Access(TOKEN)
    first = access.login(request(), TOKEN).cookie
    second = access.login(request(), TOKEN).cookie
    assert first and second and first != second
    for cookie in (first, second):
        value = cookie.split(";")[0].removeprefix(f"{COOKIE}=")
        assert TOKEN not in cookie and len(value) >= 40
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        assert "Max-Age=43200" in cookie and "Secure" not in cookie
    assert Access(TOKEN, remote=True).login(request(), TOKEN).cookie.endswith("; Secure")  # type: ignore[union-attr]
    behind_tls = request([("host", "h"), ("x-forwarded-proto", "https")])
    assert "; Secure" in (access.login(behind_tls, TOKEN).cookie or "")
    assert "; Secure" in access.clear_cookie(behind_tls)


def test_a_session_ends_at_logout_which_needs_its_csrf_token_and_at_its_expiry() -> None:
    access = Access(TOKEN)
    cookie, csrf = logged_in(access)
    assert access.verdict(request([cookie])) is Verdict.ALLOWED and len(csrf) == 64
    host = ("host", "127.0.0.1:8090")
    assert access.logout(request([host, cookie]), {})[0] == 403  # type: ignore[index]
    assert access.logout(
        request([host, cookie, ("origin", "http://evil.example")]), {"csrf": [csrf]}
    )
    assert access.verdict(request([cookie])) is Verdict.ALLOWED  # refused: still logged in
    assert access.logout(request([host, cookie]), {"csrf": [csrf]}) is None
    assert access.verdict(request([cookie])) is Verdict.ANONYMOUS  # the cookie is worth nothing
    other, _ = logged_in(access)
    assert access.verdict(request([other])) is Verdict.ALLOWED
    access.sessions = Sessions(ttl=timedelta(milliseconds=50))
    short, _ = logged_in(access)
    assert access.verdict(request([short])) is Verdict.ALLOWED
    time.sleep(0.1)
    assert access.verdict(request([short])) is Verdict.ANONYMOUS


def test_failed_logins_are_throttled_per_address_and_never_refuse_the_right_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 32, item 6: past 5 failures the right token got 429 too, for a minute, and
    # 20 failures from anywhere locked out every address.
    access = Access(TOKEN)
    with caplog.at_level(logging.INFO, logger="brooq.surface"):
        answers = [access.login(request(), "guess") for _ in range(FAILED_GUESSES_PER_CLIENT + 2)]
        assert [a.status for a in answers] == [401] * FAILED_GUESSES_PER_CLIENT + [429] * 2
        assert answers[-1].cookie is None and answers[-1].retry_after_s > 50
        assert access.login(request(), TOKEN).cookie is not None  # throttled, yet let in
        for n in range(30):  # no bound over all addresses that one could fill
            access.login(request(client=f"10.1.0.{n}:4000"), "guess")
        assert access.login(request(client="10.2.0.1:4000"), "guess").status == 401
        assert access.login(request(client="10.2.0.2:4000"), TOKEN).cookie is not None
    failed = [
        r
        for r in caplog.records
        if getattr(r, "event", "") == "DashboardLoginFailed" and r.client == "10.0.0.1"  # type: ignore[attr-defined]
    ]
    assert len(failed) == FAILED_GUESSES_PER_CLIENT
    assert all(r.levelno == logging.WARNING for r in failed)
    throttled = [r for r in caplog.records if getattr(r, "event", "") == "TokenGuessesThrottled"]
    assert [r.client for r in throttled if r.client == "10.0.0.1"] == ["10.0.0.1"]  # type: ignore[attr-defined]
    assert TOKEN not in caplog.text and "guess" not in caplog.text


def test_a_login_posted_from_another_site_is_refused_and_counts_nothing() -> None:
    # Issue 32, item 6: the login had no Origin check, so any page could post guesses from
    # the operator's browser (and address).
    access = Access(TOKEN)
    host = ("host", "127.0.0.1:8090")
    for foreign in (("origin", "http://evil.example"), ("referer", "http://evil.example/x")):
        for given in ["guess"] * 10 + [TOKEN]:
            answer = access.login(request([host, foreign]), given)
            assert (answer.status, answer.cookie) == (403, None), foreign
    assert access.login(request([host]), "guess").status == 401  # nothing was counted
    same = ("origin", "http://127.0.0.1:8090")
    assert access.login(request([host, same]), TOKEN).cookie is not None


def test_wrong_bearer_tokens_are_counted_logged_and_throttled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    access = Access(TOKEN)
    wrong = request([("authorization", "Bearer guess")])
    with caplog.at_level(logging.INFO, logger="brooq.surface"):
        verdicts = [access.verdict(wrong) for _ in range(FAILED_GUESSES_PER_CLIENT + 1)]
    assert verdicts == [Verdict.ANONYMOUS] * FAILED_GUESSES_PER_CLIENT + [Verdict.THROTTLED]
    assert access.verdict(request([("authorization", f"Bearer {TOKEN}")])) is Verdict.ALLOWED
    assert access.verdict(request()) is Verdict.ANONYMOUS  # no token sent: no guess
    rejected = [r for r in caplog.records if getattr(r, "event", "") == "BearerTokenRejected"]
    assert len(rejected) == FAILED_GUESSES_PER_CLIENT and "guess" not in caplog.text


def test_verdicts() -> None:
    assert Access(None).verdict(request()) is Verdict.READ_ONLY
    access = Access(TOKEN)
    assert access.verdict(request()) is Verdict.ANONYMOUS
    cookie, _ = logged_in(access)
    assert access.verdict(request([cookie])) is Verdict.ALLOWED
    assert access.verdict(request([("cookie", f"{COOKIE}=forged")])) is Verdict.ANONYMOUS
    assert access.verdict(request([("authorization", f"Bearer {TOKEN}")])) is Verdict.ALLOWED
    assert (
        access.verdict(
            request([("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")])
        )
        is Verdict.ANONYMOUS
    )


def test_writes_need_session_csrf_and_same_origin() -> None:
    access = Access(TOKEN)
    host = ("host", "127.0.0.1:8090")
    cookie, csrf = logged_in(access)
    assert Access(None).refuse_write(request([host]), {}) == (
        403,
        "read-only: no BROOQ_TOKEN is configured, so no action is possible",
    )
    assert access.refuse_write(request([host]), {})[0] == 401  # type: ignore[index]
    assert access.refuse_write(request([host, cookie]), {})[0] == 403  # type: ignore[index]
    assert access.refuse_write(request([host, cookie]), {"csrf": ["0" * 64]}) is not None
    assert access.refuse_write(request([host, cookie]), {"csrf": [csrf]}) is None
    evil = ("origin", "http://evil.example")
    assert access.refuse_write(request([host, cookie, evil]), {"csrf": [csrf]}) is not None
    bearer = ("authorization", f"Bearer {TOKEN}")
    assert access.refuse_write(request([host, bearer]), {}) is None


def test_same_origin() -> None:
    host = ("host", "127.0.0.1:8090")
    assert same_origin(request([host]))
    assert same_origin(request([host, ("origin", "http://127.0.0.1:8090")]))
    assert not same_origin(request([host, ("origin", "http://localhost:8090")]))
    assert not same_origin(request([host, ("origin", "null")]))
    assert not same_origin(request([host, ("referer", "http://evil.example/ui")]))


@pytest.mark.parametrize(
    "target",
    ["//evil.example/ui", "https://evil.example", "/ui\r\nX: y", "/other", "javascript:alert(1)"],
)
def test_a_redirect_never_leaves_the_dashboard(target: str) -> None:
    assert redirect(target).headers == [("Location", "/ui")]


def test_a_redirect_carries_its_notice_encoded() -> None:
    location = dict(redirect("/ui/jobs?state=dead", "retried 3 jobs & more").headers)["Location"]
    assert location == "/ui/jobs?state=dead&notice=retried+3+jobs+%26+more"


def test_query_filter() -> None:
    where = query_filter({"topic": ["a.one,b.two", "c"], "state": ["dead"], "limit": ["20"]})
    assert where.topics == ("a.one", "b.two", "c") and where.state is State.DEAD
    assert where.page_size == 20
    assert query_filter({}).page_size == 50
    for bad in (
        {"state": ["finished"]},
        {"limit": ["-3"]},
        {"since": ["soon"]},
        {"after": ["nope"]},
    ):
        with pytest.raises(InvalidInput):
            query_filter(bad)
    with pytest.raises(InvalidInput):
        query_filter({"state": ["pending"]}, states=(State.DEAD, State.CANCELED))


def test_chart_geometry() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    minutes = [
        MinuteCount(start + timedelta(minutes=i), done, dead)
        for i, (done, dead) in enumerate([(0, 0), (10, 2), (5, 0)])
    ]
    drawn = chart(minutes, width=200, height=100)
    assert drawn.peak == 10 and (drawn.done_total, drawn.dead_total) == (15, 2)
    assert drawn.done_points.split() == ["0.0,96.0", "100.0,4.0", "200.0,50.0"]
    assert drawn.done_area.startswith("0,100 ") and drawn.done_area.endswith(" 200.0,100")
    assert chart([]).peak == 1


def test_every_template_is_autoescaped() -> None:
    env = environment()
    for name in env.list_templates():
        assert "|safe" not in env.loader.get_source(env, name)[0], name  # type: ignore[union-attr]
    html = page(
        "message.html",
        verdict="read_only",
        can_act=False,
        csrf="",
        where="test",
        path="/ui",
        notice="<b>n</b>",
        title="<i>t</i>",
        text="<script>x</script>",
    )
    assert "<script>x" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<b>n</b>" not in html and "<i>t</i>" not in html
