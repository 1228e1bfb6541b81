"""Helpers for tests of `serve --http-workers N`: which worker processes serve, and a connection held by
the one we want."""

from __future__ import annotations

import http.client
import os
import re
import signal
import time
from pathlib import Path

from tests.conftest import Server


def worker_pids(server: Server, attached: str, count: int = 2) -> set[int]:
    """The server processes, from their tagged log lines once `count` of them logged `attached` (a regex)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = {int(p) for p in re.findall(rf"\[http (\d+)\]: {attached}", server.log())}
        if len(pids) == count:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"{count} workers did not attach:\n{server.log()[-3000:]}")


def served_by(conn: http.client.HTTPConnection, server_port: int, workers: set[int]) -> int | None:
    """The worker holding the other end of `conn` (an accepted socket), from /proc."""
    assert conn.sock is not None
    client_port = conn.sock.getsockname()[1]
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server_port and int(fields[2].rsplit(":", 1)[1], 16) == client_port:
                inode = fields[9]
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if fd.readlink().name == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def connect_to(pid: int, workers: set[int], host: str, port: int) -> http.client.HTTPConnection:
    """A keep-alive connection that worker `pid` accepted: the kernel hands a new connection to whichever
    worker accepts first, and with the others stopped that is the one we want."""
    others = workers - {pid}
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        get(conn, "/health")
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)
    assert served_by(conn, port, workers) == pid
    return conn


def get(conn: http.client.HTTPConnection, path: str) -> str:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read().decode()
    assert response.status == 200, body
    return body
