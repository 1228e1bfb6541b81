"""The server's side of one engine replica (engine/replicas/actor.py): an `EngineCore` that proxies to a
Ray actor, and tells whether it serves.

This process holds one stream from the actor (`attach`) and submits its requests on it; their
events come back on it in batches, each to its request's sink, in order. Every `STATE_PERIOD_S` the
replica is polled for its load (the requests it runs for every server process, and per stage),
metrics and health, one poll at a time. Between polls its load is what the last one said plus what
this process began on it since, less what of that ended.

When the actor dies, Ray says so on the poll and on every call under way: the replica is lost, each
open request ends with `Failed(code=UNAVAILABLE)` and `health()` says down, so the router sends new
work elsewhere. Ray starts the actor again (it is created with `max_restarts=-1`); when a poll is
answered again the replica serves again. One silent past `stall_timeout_s` is lost too, and killed so
that Ray starts another. Stopping ends this process's requests only: the actor belongs to the process
that launched it (engine/replicas/cluster.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from typing import Any

import ray
from ray.exceptions import RayError

from engine.api import UNAVAILABLE, EngineError, EngineHealth, Failed, Finished, OutputEvent
from engine.core import Sink
from engine.handoff import AdmittedRequest
from engine.remote.child import START_TIMEOUT_S
from engine.remote.messages import STATE_PERIOD_S
from engine.replicas.actor import ReplicaState

log = logging.getLogger(__name__)

LATE_S = 4 * STATE_PERIOD_S  # unanswered past four polls: `degraded`, not yet a stall


class ReplicaCore:
    """Owns the handle to one replica actor, this process's stream from it, the requests this process runs
    on it (their sinks, and how many it began and saw end), what its last poll said, and whether it serves."""

    def __init__(self, name: str, actor: Any, stall_timeout_s: float) -> None:
        self.name = name
        self._actor = actor
        self._stall_timeout_s = stall_timeout_s
        self._client = f"{os.getpid()}-{secrets.token_hex(4)}"  # this process, to the actor
        self._open: dict[str, Sink] = {}
        self._stream: Any = None  # the attach call's generator; a new one after each loss
        self._relay_task: asyncio.Task[None] | None = None
        self._serving = False
        self._stopping = False
        self._down = "not started"
        self._heard_at = 0.0
        self.restarts = 0  # times it served again after it was lost
        self.stage_load_now: dict[str, int] = {}
        self.health_now = EngineHealth("down", "not started")
        self.metrics_text = ""  # its engine families, as its last poll gave them
        self.pid: int | None = None
        self._begun = self._ended = 0
        self._reported_open = 0
        self._counted_at_ask = (0, 0)  # (begun, ended) when the poll that answered last was asked
        self._poller: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return self._serving and self.health_now.status != "down"

    @property
    def load(self) -> int:
        """Requests the replica runs, for every server process, as far as this one knows."""
        begun_then, ended_then = self._counted_at_ask
        return max(0, self._reported_open + (self._begun - begun_then) - (self._ended - ended_then))

    async def start(self) -> None:
        try:
            self.pid = await asyncio.wait_for(self._actor.ready.remote(), START_TIMEOUT_S)
            await asyncio.wait_for(self._attach(), START_TIMEOUT_S)
            state = await asyncio.wait_for(self._ask(), START_TIMEOUT_S)
        except (RayError, TimeoutError) as e:
            raise EngineError(f"engine replica {self.name} did not start: {type(e).__name__}: {e}") from e
        self._heard(state)
        self._serving = True
        self._poller = asyncio.get_running_loop().create_task(self._poll(), name=f"replica-{self.name}")
        log.info("engine replica %s ready (process %s)", self.name, self.pid)

    async def stop(self) -> None:
        """This process's requests end (aborted on the replica, Failed here); the replica runs on."""
        self._stopping = True
        if self._poller is not None:
            self._poller.cancel()
        if self._serving:
            for rid in self._open:
                self._actor.abort.remote(rid)
        self._serving = False
        self._end_all("server shutting down")
        self._detach()

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if not self.serving:
            raise self.health().refusal()
        if rid in self._open:
            raise EngineError(f"request id {rid} is already in use")
        self._actor.submit.remote(self._client, request)
        self._begun += 1
        self._open[rid] = sink

    def abort(self, request_id: str) -> None:
        if request_id in self._open:
            self._actor.abort.remote(request_id)  # the actor answers with the request's Failed("aborted")

    def stage_load(self) -> dict[str, int]:
        return dict(self.stage_load_now) if self.serving else {}

    def health(self) -> EngineHealth:
        if not self._serving:
            return EngineHealth("down", self._down, self.restarts, STATE_PERIOD_S * 4)
        silent_s = time.monotonic() - self._heard_at
        if silent_s > LATE_S:
            return EngineHealth("degraded", f"no word from engine replica {self.name} for {silent_s:.1f} s",
                                self.restarts)
        return EngineHealth(self.health_now.status, self.health_now.detail, self.restarts,
                            self.health_now.retry_after_s)

    async def _attach(self) -> None:
        """Open this process's stream; once the actor's first (empty) batch says it may, submit on it."""
        stream = self._actor.attach.remote(self._client)
        await (await stream.__anext__())
        self._stream = stream
        self._relay_task = asyncio.get_running_loop().create_task(self._relay(stream), name=f"replica-{self.name}-events")

    async def _attached_again(self) -> bool:
        """Back after a loss: a stream of its own before the replica serves again (False: not yet)."""
        try:
            await self._attach()
        except RayError:
            return False
        return True

    def _detach(self) -> None:
        stream, self._stream = self._stream, None
        if self._relay_task is not None and self._relay_task is not asyncio.current_task():
            self._relay_task.cancel()
        if stream is not None:
            try:
                ray.cancel(stream)  # the actor aborts what this process still had open there
            except (RayError, ValueError, TypeError):
                pass

    async def _relay(self, stream: Any) -> None:
        """The actor's batches of events -> each request's sink; a stream that fails or ends loses the replica."""
        try:
            async for ref in stream:
                batch: tuple[OutputEvent, ...] = await ref
                for event in batch:
                    self._deliver(event)
            what = f"engine replica {self.name} closed its stream"
        except RayError as e:
            what = f"engine replica {self.name} was lost ({type(e).__name__})"
        if stream is self._stream:  # not one a loss already replaced
            self._lose(what)

    def _deliver(self, event: OutputEvent) -> None:
        sink = self._open.get(event.request_id)
        if sink is None:
            return
        if isinstance(event, (Finished, Failed)):
            del self._open[event.request_id]
            self._ended += 1
        sink(event)

    async def _poll(self) -> None:
        """One poll at a time: a replica that is restarting answers only once it serves again."""
        pending: asyncio.Future[tuple[ReplicaState, tuple[int, int]]] | None = None
        while not self._stopping:
            if pending is None:
                pending = asyncio.ensure_future(self._ask())
            done, _ = await asyncio.wait([pending], timeout=STATE_PERIOD_S)
            if done:
                try:
                    state = pending.result()
                except RayError as e:
                    self._lose(f"engine replica {self.name} was lost ({type(e).__name__})")
                    await asyncio.sleep(STATE_PERIOD_S)
                except Exception:
                    log.exception("engine replica %s: poll failed", self.name)
                    await asyncio.sleep(STATE_PERIOD_S)
                else:
                    if self._serving or self._stopping or await self._attached_again():
                        self._heard(state)
                    await asyncio.sleep(STATE_PERIOD_S)
                pending = None
            elif self._serving and (silent_s := time.monotonic() - self._heard_at) > self._stall_timeout_s:
                self._lose(f"engine replica {self.name} stalled: no word from it for {silent_s:.1f} s")
                ray.kill(self._actor, no_restart=False)  # Ray starts another

    async def _ask(self) -> tuple[ReplicaState, tuple[int, int]]:
        counted = (self._begun, self._ended)
        state: ReplicaState = await self._actor.state.remote()
        return state, counted

    def _heard(self, answer: tuple[ReplicaState, tuple[int, int]]) -> None:
        state, self._counted_at_ask = answer
        self._heard_at = time.monotonic()
        self._reported_open = state.open_requests
        self.stage_load_now, self.metrics_text, self.health_now = state.stage_load, state.metrics_text, state.health
        if not self._serving and not self._stopping and self._poller is not None:  # back after a loss
            self._serving = True
            self.restarts += 1
            log.warning("engine replica %s serves again (%d restarts)", self.name, self.restarts)

    def _lose(self, what: str) -> None:
        if not self._serving or self._stopping:
            return
        self._serving = False
        self._down = f"{what}; Ray is starting it again"
        self.stage_load_now, self.metrics_text, self._reported_open = {}, "", 0
        log.error("%s: %d open requests fail", what, len(self._open))
        self._end_all(what, UNAVAILABLE, STATE_PERIOD_S * 4)
        self._detach()

    def _end_all(self, reason: str, code: str | None = None, retry_after_s: float | None = None) -> None:
        opened, self._open = self._open, {}
        self._ended += len(opened)
        for rid, sink in opened.items():
            sink(Failed(rid, reason, code, retry_after_s))
