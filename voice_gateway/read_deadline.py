"""Read deadlines on the server's HTTP/1.1 connections: a request's head within `ReadTimeouts.header_s`, no pause in
a body longer than `ReadTimeouts.body_s`, or the connection is closed. uvicorn times out only idle connections
between requests, so a slowloris client would otherwise hold its socket and buffers for good.

`http_protocol(...)`, uvicorn's `http` setting, is a picklable factory of uvicorn's h11 or httptools protocol
subclassed to wrap the connection's app: the protocol calls the app once the head is complete, ending the head's
deadline, and the body's runs while the app waits in `receive()`. The head's deadline runs from the connection's
start and from each response's end. A timed-out connection is closed without a response, as nginx does; the app
of a stalled body sees `http.disconnect`. After a WebSocket upgrade, uvicorn's pings time the socket out."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable, Scope
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadTimeouts:
    header_s: float  # from the connection's start, or the end of its last response, to a complete request head
    body_s: float  # the longest pause inside a request body

    def __post_init__(self) -> None:
        if self.header_s <= 0 or self.body_s <= 0:
            raise ValueError(f"read timeouts must be > 0 s, got {self}")


class ReadDeadline:
    """Owns one connection's timer: it closes the transport unless the awaited bytes come in time."""

    def __init__(self, timeouts: ReadTimeouts, loop: asyncio.AbstractEventLoop) -> None:
        self.timeouts = timeouts
        self.loop = loop
        self._transport: asyncio.BaseTransport | None = None
        self._owner: asyncio.BaseProtocol | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._running_requests = 0  # app calls under way on this connection (more than one when pipelined)

    def start(self, transport: asyncio.BaseTransport, owner: asyncio.BaseProtocol) -> None:
        self._transport, self._owner = transport, owner
        self._arm(self.timeouts.header_s, "request head")

    def stop(self) -> None:
        self._cancel()
        self._transport = None

    def timed(self, app: ASGI3Application) -> ASGI3Application:
        """`app` with the head's deadline ended when it is called and the body's armed while it waits for body."""
        async def app_with_deadlines(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
            self._cancel()
            self._running_requests += 1
            body_done = False

            async def timed_receive() -> ASGIReceiveEvent:
                nonlocal body_done
                if body_done:  # the app now waits for a disconnect, which may take as long as it likes
                    return await receive()
                self._arm(self.timeouts.body_s, "request body")
                try:
                    message = await receive()
                finally:
                    self._cancel()
                body_done = message["type"] != "http.request" or not message.get("more_body", False)
                return message

            try:
                await app(scope, timed_receive, send)
            finally:
                self._running_requests -= 1
                if self._running_requests == 0:
                    self._arm(self.timeouts.header_s, "request head")
        return app_with_deadlines

    def _arm(self, seconds: float, awaited: str) -> None:
        self._cancel()
        if self._transport is not None and not self._transport.is_closing():
            self._timer = self.loop.call_later(seconds, self._expire, seconds, awaited)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, seconds: float, awaited: str) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing() or transport.get_protocol() is not self._owner:
            return  # closed already, or a WebSocket's now
        peer = transport.get_extra_info("peername")
        log.info("closing the connection from %s: no %s within %g s", peer, awaited, seconds)
        transport.close()


class _Timed:
    """A uvicorn HTTP protocol with a `ReadDeadline`: mixed in before uvicorn's own class."""

    app: Any
    loop: asyncio.AbstractEventLoop

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, timeouts: ReadTimeouts) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]  # uvicorn's
        self.deadline = ReadDeadline(timeouts, self.loop)
        self.app = self.deadline.timed(self.app)

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # uvicorn's
        self.deadline.start(transport, self)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline.stop()
        super().connection_lost(exc)  # type: ignore[misc]  # uvicorn's


class TimedH11Protocol(_Timed, H11Protocol):  # type: ignore[misc]  # uvicorn narrows connection_made
    """uvicorn's h11 protocol with a `ReadDeadline`."""


class TimedHttpToolsProtocol(_Timed, HttpToolsProtocol):  # type: ignore[misc]  # as above
    """uvicorn's httptools protocol with a `ReadDeadline`."""


def http_protocol(name: str, timeouts: ReadTimeouts) -> Callable[..., asyncio.Protocol]:
    """uvicorn's `http` setting for `--http NAME`; "auto" is httptools, installed with us, as uvicorn picks."""
    protocols: dict[str, type[TimedH11Protocol | TimedHttpToolsProtocol]] = {
        "auto": TimedHttpToolsProtocol, "h11": TimedH11Protocol, "httptools": TimedHttpToolsProtocol}
    if name not in protocols:
        raise ValueError(f"unknown HTTP protocol {name!r}, expected auto, h11 or httptools")
    return functools.partial(protocols[name], timeouts=timeouts)
