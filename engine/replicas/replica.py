"""The server's side of one engine replica (engine/replicas/actor.py): an `EngineCore` that proxies to it
over its channel, and tells whether it serves.

Ray says where the replica's channel is (`ready`); this process connects to it, submits and cancels
its requests on it, and hears their events, batched, and every `STATE_PERIOD_S` the replica's state:
its load (the requests it runs for every server process, and per stage) and its metrics. Between two
states its load is what the last one said, plus what this process sent that the replica had not yet
seen, less what of either ended since.

When the actor dies its channel closes: the replica is lost, each open request ends with
`Failed(code=UNAVAILABLE)` and `health()` says down, so the router sends new work elsewhere. Ray starts
the actor again (it is created with `max_restarts=-1`); once it answers `ready` this process connects
again and the replica serves again. One silent past `stall_timeout_s` (a wedged process, a host gone
without a word; time this process was stopped too does not count, engine/remote/silence.py) is lost
too, and killed so that Ray starts another. Stopping ends this process's requests only (the replica
aborts what a connection that leaves had open): the actor belongs to the process that launched it
(engine/replicas/cluster.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from typing import Any

import ray
from ray.exceptions import RayError

from engine.api import UNAVAILABLE, EngineError, EngineHealth, Failed
from engine.core import Sink, deliver
from engine.handoff import AdmittedRequest
from engine.remote.child import START_TIMEOUT_S
from engine.remote.messages import STATE_PERIOD_S, Cancel, Closed, Events, Ready, State, Submit
from engine.remote.pipe import cut, portable, read_into, send
from engine.remote.silence import Silence
from engine.replicas.actor import ReplicaChannel

log = logging.getLogger(__name__)

LATE_S = 4 * STATE_PERIOD_S  # silent past four beats: `degraded`, not yet a stall


class ReplicaCore:
    """Owns the handle to one replica actor, this process's connection to it, the requests this process
    runs on it (their sinks, and how many it sent and saw end), what its last state said, and whether
    it serves."""

    def __init__(self, name: str, actor: Any, stall_timeout_s: float) -> None:
        self.name = name
        self._actor = actor
        self._stall_timeout_s = stall_timeout_s
        self._open: dict[str, Sink] = {}
        self._conn: Connection | None = None  # a new one after each loss
        self.serving = False
        self._stopping = False
        self._down = "not started"
        self._silence = Silence()  # on this connection
        self.restarts = 0  # times it served again after it was lost
        self.metrics_text = ""  # its engine families, as its last state gave them
        self.pid: int | None = None
        self._stage_load: dict[str, int] = {}
        self._sent = self._ended = 0  # on this connection
        self._reported_open = self._received = self._ended_at_state = 0
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def load(self) -> int:
        """Requests the replica runs, for every server process, as far as this one knows."""
        unseen = self._sent - self._received
        return max(0, self._reported_open + unseen - (self._ended - self._ended_at_state))

    async def start(self) -> None:
        try:
            await self._connect()
        except (RayError, TimeoutError) as e:
            raise EngineError(f"engine replica {self.name} did not start: {type(e).__name__}: {e}") from e
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name=f"replica-{self.name}")
        log.info("engine replica %s ready (process %s)", self.name, self.pid)

    async def stop(self) -> None:
        """This process's requests end (aborted on the replica, Failed here); the replica runs on."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        self.serving = False
        self._end_all("server shutting down")
        self._drop()

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if not self.serving or self._conn is None:
            raise self.health().refusal()
        if rid in self._open:
            raise EngineError(f"request id {rid} is already in use")
        self._open[rid] = sink
        self._sent += 1
        if not send(self._conn, Submit(request)):  # the reader's Closed ends it with the others
            log.error("engine replica %s: its channel is closed", self.name)

    def abort(self, request_id: str) -> None:
        if request_id in self._open and self._conn is not None:
            send(self._conn, Cancel(request_id))  # the replica answers with the request's Failed("aborted")

    def stage_load(self) -> dict[str, int]:
        return dict(self._stage_load) if self.serving else {}

    def health(self) -> EngineHealth:
        if not self.serving:
            return EngineHealth("down", self._down, self.restarts, STATE_PERIOD_S * 4)
        if (silent_s := self._silence.seconds) > LATE_S:
            return EngineHealth("degraded", f"no word from engine replica {self.name} for {silent_s:.1f} s",
                                self.restarts)
        return EngineHealth("ok", restarts=self.restarts)

    async def _connect(self) -> None:
        """Ask Ray where the replica's channel is (once it serves) and connect; EngineError if it cannot be
        reached."""
        channel: ReplicaChannel = await asyncio.wait_for(self._actor.ready.remote(), START_TIMEOUT_S)
        try:
            conn = await asyncio.wait_for(asyncio.to_thread(_dial, channel), START_TIMEOUT_S)
        except (OSError, EOFError, AuthenticationError, TimeoutError) as e:
            host, port = channel.address
            raise EngineError(f"cannot reach engine replica {self.name} at {host}:{port}: {type(e).__name__}: {e}") from e
        self.pid, self._conn = channel.pid, conn
        self._sent = self._ended = self._reported_open = self._received = self._ended_at_state = 0
        self._silence = Silence()
        self.serving = True
        read_into(conn, asyncio.get_running_loop(), functools.partial(self._on_messages, conn))

    def _drop(self) -> None:
        """Let go of the connection: the replica aborts what this process had open on it, and the reader ends."""
        conn, self._conn = self._conn, None
        if conn is not None:
            cut(conn)

    def _on_messages(self, conn: Connection, batch: list[Any]) -> None:
        if conn is not self._conn:
            return  # a lost connection's last words
        self._silence.heard()
        for message in batch:
            match message:
                case Events(events):
                    for event in events:
                        self._ended += deliver(self._open, event)
                case State():
                    self._stage_load, self.metrics_text = message.stage_load, message.metrics_text
                    self._reported_open, self._received = message.open_requests, message.received
                    self._ended_at_state = self._ended
                case Closed():
                    self._lose(f"engine replica {self.name} was lost (its channel closed)")

    async def _supervise(self) -> None:
        """While it serves, watch it for a stall (a loss comes from the reader); once it is lost, connect
        again as soon as Ray says it serves."""
        while not self._stopping:
            await asyncio.sleep(STATE_PERIOD_S)
            if self.serving:
                if (silent_s := self._silence.look()) > self._stall_timeout_s:
                    self._lose(f"engine replica {self.name} stalled: no word from it for {silent_s:.1f} s")
                    ray.kill(self._actor, no_restart=False)  # Ray starts another
                continue
            try:
                await self._connect()
            except (RayError, EngineError, TimeoutError) as e:  # not back yet
                log.debug("engine replica %s: not serving yet: %s", self.name, e)
                continue
            if self._stopping:
                self._drop()
                return
            self.restarts += 1
            log.warning("engine replica %s serves again (process %s, %d restarts)", self.name, self.pid, self.restarts)

    def _lose(self, what: str) -> None:
        if not self.serving or self._stopping:
            return
        self.serving = False
        self._down = f"{what}; Ray is starting it again"
        self._stage_load, self.metrics_text = {}, ""
        log.error("%s: %d open requests fail", what, len(self._open))
        self._end_all(what, UNAVAILABLE, STATE_PERIOD_S * 4)
        self._drop()

    def _end_all(self, reason: str, code: str | None = None, retry_after_s: float | None = None) -> None:
        opened, self._open = self._open, {}
        self._ended += len(opened)
        for rid, sink in opened.items():
            sink(Failed(rid, reason, code, retry_after_s))


def _dial(channel: ReplicaChannel) -> Connection:
    """Connect, and read the replica's `Ready`."""
    conn = portable(Client(channel.address, authkey=channel.authkey))
    first = conn.recv()
    if not isinstance(first, Ready):
        conn.close()
        raise EOFError(f"the replica said {type(first).__name__} first, not Ready")
    return conn
