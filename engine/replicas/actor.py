"""One engine replica as a Ray actor: a core (engine/local.py) in the actor's own process, the events of
each server process's requests streamed back to it in batches on one stream, and its state (requests
open, stage load, metrics, health) on demand, to every server process that polls it.

Ray runs it as an async actor, so every method runs on the actor's one event loop, which is where a
core expects `begin`, `abort` and its sinks. This module does not import Ray: engine/replicas/cluster.py
wraps the class with `ray.remote` where Ray is installed, and a worker imports it by name.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import generate_latest

from engine.api import EngineError, EngineHealth, Failed, Finished, OutputEvent
from engine.handoff import AdmittedRequest
from engine.remote.messages import STATE_PERIOD_S, EngineSpec
from engine.weights.source import ModelSource

EARLY_ABORTS = 1024


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a poll returns."""

    open_requests: int  # every server process's, so that each routes by the replica's whole load
    stage_load: dict[str, int]
    metrics_text: str  # the engine's Prometheus families, as text
    health: EngineHealth


class ReplicaActor:
    """Owns one core, loaded when Ray creates the actor (and again each time Ray restarts it), started
    on its first call; the server processes attached to it, each with its events not yet sent; and
    which of them each open request belongs to.

    A server process holds one stream (`attach`) and submits on it: every event of its requests goes
    out on that stream, those that arrived together in one batch. One stream per request cost a Ray
    object per batch per request, each a message both processes handle beside the engine's threads."""

    def __init__(self, spec: EngineSpec) -> None:
        from engine.local import load_core  # the replica's process alone loads the stages

        self.spec = spec
        source = ModelSource.open(spec.model, spec.profile.load_format, spec.cache_dir)
        self.core = load_core(source, spec.profile)
        self._started: asyncio.Future[None] | None = None
        self._clients: dict[str, asyncio.Queue[OutputEvent]] = {}
        self._routes: dict[str, str] = {}  # request id -> the client that submitted it
        self._aborted_early: dict[str, None] = {}  # aborts that overtook their submit, the latest EARLY_ABORTS
        self._metrics = ("", -STATE_PERIOD_S)  # (text, when): made once a period, however many poll

    async def ready(self) -> int:
        """Once the core serves: this process's id."""
        await self._start()
        return os.getpid()

    async def describe(self) -> EngineSpec:
        """What it runs: a server process that attaches opens its own front door from it."""
        return self.spec

    async def state(self) -> ReplicaState:
        await self._start()
        text, made_at = self._metrics
        if time.monotonic() - made_at > STATE_PERIOD_S / 2:
            text = generate_latest(self.core.registry).decode()
            self._metrics = (text, time.monotonic())
        return ReplicaState(len(self._routes), self.core.stage_load(), text, self.core.health())

    async def attach(self, client: str) -> AsyncIterator[tuple[OutputEvent, ...]]:
        """`client`'s events, batched by what arrived since the last batch; an empty batch first, once it
        may submit. A caller that goes away (its stream closed or cancelled) aborts its open requests."""
        await self._start()
        events: asyncio.Queue[OutputEvent] = asyncio.Queue()
        self._clients[client] = events
        try:
            yield ()
            while True:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                yield tuple(batch)
        finally:
            if self._clients.get(client) is events:
                del self._clients[client]
            for rid in [rid for rid, owner in self._routes.items() if owner == client]:
                self.core.abort(rid)

    async def submit(self, client: str, request: AdmittedRequest) -> None:
        """Begin a request; its events, a refusal too, go out on `client`'s stream."""
        rid = request.request_id
        events = self._clients.get(client)
        if events is None:  # its stream ended: nobody would hear the request's events
            return
        if rid in self._aborted_early:
            del self._aborted_early[rid]
            events.put_nowait(Failed(rid, "aborted"))
            return
        self._routes[rid] = client
        try:
            self.core.begin(request, functools.partial(self._deliver, rid))
        except EngineError as e:
            self._deliver(rid, Failed(rid, str(e), e.code, e.retry_after_s))

    async def abort(self, request_id: str) -> None:
        """The request ends with Failed("aborted"), even one whose submit has not arrived yet."""
        if request_id in self._routes:
            self.core.abort(request_id)
        else:  # or one that ended already, its end on its way: hence a bound
            self._aborted_early[request_id] = None
            if len(self._aborted_early) > EARLY_ABORTS:
                del self._aborted_early[next(iter(self._aborted_early))]

    async def stop(self) -> None:
        """Every request still open ends with Failed."""
        if self._started is not None:
            await self.core.stop()

    def _deliver(self, request_id: str, event: OutputEvent) -> None:
        client = self._routes.get(request_id)
        if isinstance(event, (Finished, Failed)):
            self._routes.pop(request_id, None)
        if client is not None and (events := self._clients.get(client)) is not None:
            events.put_nowait(event)

    async def _start(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self.core.start())
        await asyncio.shield(self._started)
