"""The HTTP server of the surface, alone (no database): deadlines, the connection cap,
close(), fork safety, the bearer guard and what the answers never carry.

Real sockets on 127.0.0.1, real threads; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from brooq.surface import (
    HealthBoard,
    Limits,
    Request,
    Response,
    Router,
    ServiceSurface,
    SurfaceConfigError,
    SurfaceServer,
    check_bind,
    refuse_unless_bearer,
)
from brooq.vocabulary import BrooqError
from tests.slow_clients import Slowloris

TOKEN = "surface-test-token-0123456789abcdef"


class Answer:
    """One raw HTTP answer."""

    def __init__(self, raw: bytes, seconds: float) -> None:
        self.raw, self.seconds = raw, seconds
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
        self.headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }


def send(port: int, data: bytes, timeout: float = 3.0) -> Answer:
    """Send ``data`` on a new connection, read until the server closes; the answer."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return Answer(b"".join(chunks), time.monotonic() - started)


def get(port: int, path: str, headers: str = "", method: str = "GET") -> Answer:
    """A well-formed request."""
    return send(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())


def echo_router(
    gate: threading.Event | None = None, blocked: threading.Semaphore | None = None
) -> Router:
    """/ok answers; /block waits on ``gate`` (releasing ``blocked`` once inside);
    /boom raises; /echo/<word> shows what was parsed."""
    router = Router()

    def block(request: Request) -> Response:
        assert gate is not None
        if blocked is not None:
            blocked.release()
        gate.wait(10)
        return Response.text(200, "released")

    def boom(request: Request) -> Response:
        raise RuntimeError("/secret/path/of/the/server.py")

    def echo(request: Request) -> Response:
        return Response.json(
            200,
            {
                "word": request.params["word"],
                "query": request.query,
                "cookies": request.cookies,
                "form": request.form(),
                "body": request.body.decode(),
            },
        )

    def guarded(request: Request) -> Response:
        return refuse_unless_bearer(request, TOKEN) or Response.json(200, {"ok": True})

    router.add("GET", "/ok", lambda r: Response.text(200, "ok"))
    router.add("GET", "/block", block)
    router.add("GET", "/boom", boom)
    router.add("GET", "/guarded", guarded)
    router.add_pattern(["GET", "POST"], r"/echo/(?P<word>\w+)", echo)
    router.add("GET", "/big", lambda r: Response(200, b"x" * (16 * 1024 * 1024)))
    return router


@pytest.fixture
def serve() -> Iterator[Callable[..., SurfaceServer]]:
    """``serve(router=None, **limits)``: a started server on a free port, closed afterwards."""
    servers: list[SurfaceServer] = []

    def start(router: Router | None = None, **limits: float) -> SurfaceServer:
        server = SurfaceServer("127.0.0.1:0", router or echo_router(), Limits(**limits)).start()  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def port_of(server: SurfaceServer) -> int:
    return int(server.address.rsplit(":", 1)[1])


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# --- the deadline ----------------------------------------------------------------------------


def test_a_trickling_client_is_cut_off_at_the_request_deadline(
    serve: Callable[..., SurfaceServer],
) -> None:
    """One byte every 0.3 s: each read is quick, the request as a whole is not."""
    port = port_of(serve())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nX: ")
        answer = b""
        sock.settimeout(0.3)
        while time.monotonic() - started < 5:
            try:
                answer = sock.recv(4096)
                break
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(b"x")
        cut = time.monotonic() - started
    assert 0.9 <= cut <= 1.3, cut
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b""


def test_a_slow_body_is_cut_off_too(serve: Callable[..., SurfaceServer]) -> None:
    port = port_of(serve())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /echo/a HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert 0.9 <= time.monotonic() - started <= 1.3


def test_a_client_that_never_reads_its_answer_is_cut_off(
    serve: Callable[..., SurfaceServer],
) -> None:
    server = serve(write_timeout=0.5)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(5)
        sock.connect(("127.0.0.1", port_of(server)))
        sock.sendall(b"GET /big HTTP/1.1\r\n\r\n")
        wait_for(lambda: server.open_connections() == 1, 2, "the request to be served")
        started = time.monotonic()
        wait_for(lambda: server.open_connections() == 0, 3, "the writer to give up")
        assert time.monotonic() - started < 1.0


# --- the connection cap ------------------------------------------------------------------------


def test_past_the_cap_a_new_connection_is_refused_at_once_when_all_run_handlers(
    serve: Callable[..., SurfaceServer],
) -> None:
    gate = threading.Event()
    inside = threading.Semaphore(0)
    server = serve(echo_router(gate, inside), max_connections=4)
    port = port_of(server)
    blocked = [threading.Thread(target=get, args=(port, "/block"), daemon=True) for _ in range(4)]
    for t in blocked:
        t.start()
    try:
        # Open connections are not enough: one still reading its request is a slow
        # client, and evicting it is the other rule. Wait for four handlers inside.
        for _ in range(4):
            assert inside.acquire(timeout=3), "four handlers running"
        refused = get(port, "/ok")
        assert refused.status == 503 and refused.seconds < 0.5
        assert server.open_connections() == 4
    finally:
        gate.set()
    for t in blocked:
        t.join(5)
    wait_for(lambda: server.open_connections() == 0, 2, "the slots released")
    assert get(port, "/ok").status == 200


def test_past_the_cap_the_oldest_slow_client_gives_up_its_slot(
    serve: Callable[..., SurfaceServer],
) -> None:
    server = serve(max_connections=4, request_timeout=10.0)
    port = port_of(server)
    slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
    try:
        for sock in slow:
            sock.sendall(b"GET /ok HTTP/1.1\r\nX: ")
            time.sleep(0.02)  # a known order: slow[0] is the oldest
        wait_for(lambda: server.open_connections() == 4, 3, "four slow clients held")
        answer = get(port, "/ok")
        assert answer.status == 200 and answer.seconds < 0.5
        assert slow[0].recv(100) == b""  # evicted: closed without an answer
        assert server.open_connections() <= 4
    finally:
        for sock in slow:
            sock.close()
    wait_for(lambda: server.open_connections() == 0, 2, "every slot released")


def test_the_slot_is_released_whatever_happened(serve: Callable[..., SurfaceServer]) -> None:
    server = serve(max_connections=2)
    port = port_of(server)
    assert get(port, "/boom").status == 500
    assert send(port, b"garbage\r\n\r\n").status == 400
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\n")  # then hang up mid-request
    wait_for(lambda: server.open_connections() == 0, 2, "every slot released")
    for _ in range(5):
        assert get(port, "/ok").status == 200


def test_a_request_is_answered_within_a_second_while_50_slow_clients_trickle(
    serve: Callable[..., SurfaceServer],
) -> None:
    server = serve()
    port = port_of(server)
    attack = Slowloris("127.0.0.1", port, n=50, duration=6.0, prefix=b"GET /ok HTTP/1.1\r\nX: ")
    attack.start()
    try:
        time.sleep(0.3)
        answers = []
        for _ in range(10):
            answers.append(get(port, "/ok"))
            assert server.open_connections() <= 32
            time.sleep(0.3)
    finally:
        attack.stop()
    assert [a.status for a in answers] == [200] * 10
    assert max(a.seconds for a in answers) < 1.0, [a.seconds for a in answers]
    assert attack.stats.connections >= 50


# --- close() -------------------------------------------------------------------------------


def test_close_returns_fast_with_slow_clients_and_a_busy_handler_attached(
    serve: Callable[..., SurfaceServer],
) -> None:
    gate = threading.Event()
    server = SurfaceServer("127.0.0.1:0", echo_router(gate), Limits(request_timeout=30.0)).start()
    port = port_of(server)
    attack = Slowloris("127.0.0.1", port, n=20, duration=10.0, reconnect=False)
    attack.start()
    busy = threading.Thread(target=get, args=(port, "/block"), daemon=True)
    busy.start()
    try:
        wait_for(lambda: server.open_connections() == 21, 3, "21 connections held")
        started = time.monotonic()
        server.close()
        assert time.monotonic() - started < 1.2
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        wait_for(lambda: len(attack.stats.cut_after) == 20, 2, "every slow client cut")
    finally:
        gate.set()
        attack.stop()


def socket_inodes(pid: int) -> set[str]:
    """The sockets a process holds open, as ``socket:[inode]`` links of /proc/<pid>/fd."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:"):
                found.add(link)
    return found


def test_a_forked_child_holds_none_of_the_server_s_sockets(
    serve: Callable[..., SurfaceServer],
) -> None:
    """A child that kept a client's socket or the listener would keep them alive past close()."""
    server = serve()
    port = port_of(server)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as held:
        held.sendall(b"GET /ok HTTP/1.1\r\n")
        wait_for(lambda: server.open_connections() == 1, 2, "a connection held")
        ours = {
            f"socket:[{os.fstat(s.fileno()).st_ino}]"
            for s in [server._listener, *(c.sock for c in server._conns)]
        }
        assert len(ours) == 2 and ours <= socket_inodes(os.getpid())
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read_fd)
            os.write(write_fd, b"1")
            time.sleep(5)
            os._exit(0)
        os.close(write_fd)
        try:
            assert os.read(read_fd, 1) == b"1"
            assert socket_inodes(pid) & ours == set()
            assert get(port, "/ok").status == 200  # the parent serves on
        finally:
            os.close(read_fd)
            os.kill(pid, 9)
            os.waitpid(pid, 0)


# --- HTTP details ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(
    serve: Callable[..., SurfaceServer], scheme: str
) -> None:
    port = port_of(serve())
    assert get(port, "/guarded", f"Authorization: {scheme} {TOKEN}\r\n").status == 200


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Authorization: Bearer wrong\r\n",
        f"Authorization: Basic {TOKEN}\r\n",
        f"Authorization: {TOKEN}\r\n",
        f"Authorization: Bearer {TOKEN}x\r\n",
        "Authorization: Bearer \r\n",
    ],
)
def test_a_missing_or_wrong_token_is_401(serve: Callable[..., SurfaceServer], header: str) -> None:
    answer = get(port_of(serve()), "/guarded", header)
    assert answer.status == 401 and answer.headers["www-authenticate"].startswith("Bearer")


def test_two_authorization_headers_are_refused(serve: Callable[..., SurfaceServer]) -> None:
    port = port_of(serve())
    both = f"Authorization: Bearer {TOKEN}\r\nAuthorization: Bearer {TOKEN}\r\n"
    assert get(port, "/guarded", both).status == 400
    mixed = f"Authorization: Bearer wrong\r\nauthorization: Bearer {TOKEN}\r\n"
    assert get(port, "/guarded", mixed).status == 400


def test_no_token_configured_means_the_guarded_route_does_not_exist() -> None:
    request = Request("GET", "/x", "/x", {}, (("authorization", f"Bearer {TOKEN}"),))
    refusal = refuse_unless_bearer(request, None)
    assert refusal is not None and refusal.status == 404 and b"disabled" in refusal.body


def test_no_answer_names_the_server_or_python(serve: Callable[..., SurfaceServer]) -> None:
    server = serve(request_timeout=0.3)
    port = port_of(server)
    answers = [
        get(port, "/ok"),
        get(port, "/nope"),
        get(port, "/ok", method="POST"),
        get(port, "/boom"),
        send(port, b"NOT HTTP\r\n\r\n"),
        send(port, b"GET /ok HTTP/1.1\r\nX: slow"),
        send(port, b"GET /ok HTTP/2.0\r\n\r\n"),
        get(port, "/guarded", "Authorization: Bearer no\r\n"),
    ]
    assert [a.status for a in answers] == [200, 404, 405, 500, 400, 408, 505, 401]
    for answer in answers:
        assert "server" not in answer.headers, answer.raw
        assert b"python" not in answer.raw.lower() and b"basehttp" not in answer.raw.lower()
        assert b"secret" not in answer.raw  # the handler's exception stays in the log
        assert answer.headers["connection"] == "close"


def test_limits_of_size_and_framing(serve: Callable[..., SurfaceServer]) -> None:
    port = port_of(serve(max_body_bytes=10))
    assert send(port, b"GET /ok HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n").status == 431
    assert send(port, b"POST /echo/a HTTP/1.1\r\nContent-Length: 11\r\n\r\n").status == 413
    assert send(port, b"POST /echo/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status == 411
    assert (
        send(
            port, b"POST /echo/a HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
        ).status
        == 400
    )
    assert send(port, b"GET /ok HTTP/1.1\r\n folded: header\r\n\r\n").status == 400


def test_routes_parse_what_a_dashboard_needs(serve: Callable[..., SurfaceServer]) -> None:
    port = port_of(serve())
    body = "state=dead&state=failed&q=a+b"
    answer = send(
        port,
        (
            'POST /echo/word?page=2&x= HTTP/1.1\r\nCookie: session=abc; theme="dark"\r\n'
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode(),
    )
    assert answer.status == 200
    data = json.loads(answer.body)
    assert data == {
        "word": "word",
        "query": {"page": ["2"], "x": [""]},
        "cookies": {"session": "abc", "theme": "dark"},
        "form": {"state": ["dead", "failed"], "q": ["a b"]},
        "body": body,
    }
    head = get(port, "/ok", method="HEAD")
    assert head.status == 200 and head.body == b"" and head.headers["content-length"] == "2"
    refused = get(port, "/ok", method="DELETE")
    assert refused.status == 405 and refused.headers["allow"] == "GET"


def test_a_route_cannot_be_added_twice() -> None:
    router = Router()
    router.add("GET", "/a", lambda r: Response())
    with pytest.raises(ValueError, match="already routed"):
        router.add("get", "/a", lambda r: Response())


def test_response_headers_cannot_be_injected() -> None:
    raw = Response(200, b"", [("Set-Cookie", "a=1\r\nX-Evil: 1"), ("X-Ok", "1")]).encode()
    assert b"X-Evil" not in raw and b"X-Ok: 1" in raw


# --- where the surface may listen -------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_token_but_refuses_a_weak_one(host: str) -> None:
    check_bind(host, None, allow_remote=False)
    check_bind(host, TOKEN, allow_remote=False)
    for weak in ("short", "t" * 40):  # issue 22, item 8: on loopback too
        with pytest.raises(SurfaceConfigError, match="BROOQ_TOKEN"):
            check_bind(host, weak, allow_remote=False)


def test_a_non_loopback_address_needs_the_flag_and_a_32_byte_token() -> None:
    with pytest.raises(SurfaceConfigError, match="--http-allow-remote"):
        check_bind("0.0.0.0", TOKEN, allow_remote=False)
    with pytest.raises(SurfaceConfigError, match="BROOQ_TOKEN"):
        check_bind("0.0.0.0", None, allow_remote=True)
    with pytest.raises(SurfaceConfigError, match=r"31 bytes.*at least 32 bytes"):
        check_bind("10.0.0.1", "x" * 31, allow_remote=True)
    with pytest.raises(SurfaceConfigError, match="30 bytes"):
        check_bind("", "é" * 15, allow_remote=True)  # bytes, not characters
    check_bind("0.0.0.0", TOKEN[:32], allow_remote=True)
    check_bind("::", "é" * 15 + "ab", allow_remote=True)


def test_the_service_surface_refuses_a_weak_token_before_binding() -> None:
    with pytest.raises(SurfaceConfigError) as caught:
        ServiceSurface(
            "0.0.0.0:0",
            dsn="postgresql://nowhere/none",
            topics=[],
            supervisor_pid=os.getpid(),
            health=HealthBoard(),
            token="x" * 16,
            allow_remote=True,
        )
    assert isinstance(caught.value, BrooqError) and "at least 32 bytes" in str(caught.value)


def test_an_address_in_use_is_a_surface_config_error(serve: Callable[..., SurfaceServer]) -> None:
    server = serve()
    with pytest.raises(SurfaceConfigError, match="cannot listen"):
        SurfaceServer(server.address, Router())
