"""One end of a pipe to or from the engine's process: a reader thread that hands messages to an event loop.

The reader blocks on the pipe without the GIL and hands whatever it finds to its loop in one call, so a burst
of messages costs the loop one wake-up. Between a server process and an engine child it started, multiprocessing
pickles a tensor as a file descriptor of shared memory; a process Ray started cannot take those, so a `portable`
connection carries every byte in-band. Its TCP socket also sends at once: multiprocessing writes a large message
as its length and then its bytes, and Nagle's algorithm would hold the bytes' last segment until the length is
acknowledged, which the peer delays."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from engine.remote.messages import Closed

log = logging.getLogger(__name__)


def read_into(conn: Connection, loop: asyncio.AbstractEventLoop, handle: Callable[[list[Any]], None]) -> None:
    """A thread reading `conn` until it closes; `handle(batch)` runs on `loop`, the last batch ending in `Closed()`."""
    threading.Thread(target=_read, args=(conn, loop, handle), name="engine-pipe", daemon=True).start()


def _read(conn: Connection, loop: asyncio.AbstractEventLoop, handle: Callable[[list[Any]], None]) -> None:
    while True:
        batch: list[Any] = []
        try:
            batch.append(conn.recv())
            while conn.poll():
                batch.append(conn.recv())
        except (EOFError, OSError, TypeError):  # TypeError: this side closed it under us (a detach)
            batch.append(Closed())
        except Exception:  # a message that cannot be read: nothing after it can be trusted
            log.exception("engine pipe: a message could not be read; dropping the connection")
            batch.append(Closed())
        try:
            loop.call_soon_threadsafe(handle, batch)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return
        if isinstance(batch[-1], Closed):
            return


def send(conn: Connection, message: Any) -> bool:
    """Send one message; False when the other side is gone (its reader reports that too)."""
    try:
        conn.send(message)
        return True
    except OSError:
        return False


def cut(conn: Connection) -> None:
    """Shut a connection down both ways, still open: the other side reads its end, and so does our reader,
    even one blocked on a peer that went silent (closing alone would leave it waiting)."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed, or already shut down
        pass


class _PortableConnection(Connection):
    def send(self, obj: Any) -> None:
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        return pickle.loads(self.recv_bytes())


def portable(conn: Connection) -> Connection:
    """The same connection, its messages pickled in-band and, on TCP, sent without delay (the given one closed)."""
    try:
        fd = os.dup(conn.fileno())
    finally:
        conn.close()
    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _PortableConnection(fd)
