"""Slowloris against a real server, with either HTTP parser: connections that never finish a request head, or
that stall inside a body, are closed after the read timeouts, while other clients are served meanwhile."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import Server, start_server, stop_server
from tests.reliability.hostile import open_fds

HEADER_S = BODY_S = 1.0
SLACK_S = 8.0  # a loaded 2-core machine's scheduling, on top of the timeouts


@pytest.fixture(scope="module", params=["auto", "h11"])
def timed_server(request: pytest.FixtureRequest, tiny_checkpoint: Path, cache_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp(f"slow-{request.param}") / "server.log",
                             "--http", request.param, "--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S))
    yield srv
    stop_server(proc)


def _settled_fds(pid: int) -> int:
    """The server's fd count once it stops changing (a client that just left may still hold one there)."""
    previous = open_fds(pid)
    for _ in range(20):
        time.sleep(0.2)
        if (count := open_fds(pid)) == previous:
            break
        previous = count
    return previous


def _connect(server: Server, first_bytes: bytes = b"") -> socket.socket:
    url = urlsplit(server.base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    if first_bytes:
        sock.sendall(first_bytes)
    return sock


def _closed_by_server(sock: socket.socket, deadline: float) -> bytes:
    """Reads until the server closes the socket (what it sent first, if anything); fails at `deadline`."""
    received = b""
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return received
        except TimeoutError:
            pytest.fail(f"still open at the deadline, having received {received[:200]!r}")
        if not data:
            return received
        received += data


def _response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length, read off a connection that stays open."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _chat_head(content_length: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % content_length)


def test_half_sent_requests_are_closed_while_others_are_served(timed_server: Server) -> None:
    before = _settled_fds(timed_server.pid)
    opened = time.monotonic()
    slow = [_connect(timed_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a") for _ in range(30)]
    slow += [_connect(timed_server) for _ in range(10)]  # never a byte
    slow += [_connect(timed_server, _chat_head(1000) + b'{"model": "tiny", ') for _ in range(10)]  # a body that stalls
    try:
        deadline = time.monotonic() + 5
        while open_fds(timed_server.pid) < before + len(slow) - 2:
            assert time.monotonic() < deadline, f"the server holds {open_fds(timed_server.pid) - before} of {len(slow)}"
            time.sleep(0.05)
        assert timed_server.get("/health").status_code == 200
        for sock in slow:
            assert _closed_by_server(sock, opened + HEADER_S + BODY_S + SLACK_S) == b""
    finally:
        for sock in slow:
            sock.close()
    deadline = time.monotonic() + 5
    while open_fds(timed_server.pid) > before + 2:
        assert time.monotonic() < deadline, f"fds {before} -> {open_fds(timed_server.pid)} after the slow clients went"
        time.sleep(0.05)
    assert timed_server.get("/health").json()["status"] == "ok"


def test_a_slow_but_steady_body_is_answered(timed_server: Server) -> None:
    body = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    sock = _connect(timed_server, _chat_head(len(body)))
    try:
        pieces = [body[i:i + 4] for i in range(0, len(body), 4)]
        # each pause well under the body timeout, the whole body well over both timeouts
        pause_s = max(2.5 * (HEADER_S + BODY_S) / len(pieces), 0.05)
        assert pause_s < BODY_S / 2
        for piece in pieces:
            time.sleep(pause_s)
            sock.sendall(piece)
        reply = _response(sock)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 404"), reply[:200]


def test_a_keep_alive_connection_gets_the_same_deadline_for_its_next_head(timed_server: Server) -> None:
    sock = _connect(timed_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        assert _response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # cancels uvicorn's keep-alive timer: ours must still run
        ended = time.monotonic()
        assert _closed_by_server(sock, ended + HEADER_S + SLACK_S) == b""
    finally:
        sock.close()
