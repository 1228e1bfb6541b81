"""One engine replica as a Ray actor: a core (engine/local.py) in the actor's own process, each request's
events streamed back to its server process in batches, and its state (requests open, stage load,
metrics, health) on demand, to every server process that polls it.

Ray runs it as an async actor, so every method runs on the actor's one event loop, which is where a
core expects `begin`, `abort` and its sinks. This module does not import Ray: engine/replicas/cluster.py
wraps the class with `ray.remote` where Ray is installed, and a worker imports it by name.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import generate_latest

from engine.api import EngineError, EngineHealth, Failed, Finished, OutputEvent
from engine.handoff import AdmittedRequest
from engine.remote.messages import STATE_PERIOD_S, EngineSpec
from engine.weights.source import ModelSource


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a poll returns."""

    open_requests: int  # every server process's, so that each routes by the replica's whole load
    stage_load: dict[str, int]
    metrics_text: str  # the engine's Prometheus families, as text
    health: EngineHealth


class ReplicaActor:
    """Owns one core, loaded when Ray creates the actor (and again each time Ray restarts it), started
    on its first call; and how many requests it runs, from whichever server process."""

    def __init__(self, spec: EngineSpec) -> None:
        from engine.local import load_core  # the replica's process alone loads the stages

        self.spec = spec
        source = ModelSource.open(spec.model, spec.profile.load_format, spec.cache_dir)
        self.core = load_core(source, spec.profile)
        self._started: asyncio.Future[None] | None = None
        self._open = 0
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
        return ReplicaState(self._open, self.core.stage_load(), text, self.core.health())

    async def run(self, request: AdmittedRequest) -> AsyncIterator[tuple[OutputEvent, ...]]:
        """The request's events, batched by what arrived since the last batch, up to Finished or Failed.
        A caller that goes away (its generator closed or cancelled) aborts the request."""
        await self._start()
        rid = request.request_id
        events: asyncio.Queue[OutputEvent] = asyncio.Queue()
        try:
            self.core.begin(request, events.put_nowait)
        except EngineError as e:
            yield (Failed(rid, str(e), e.code, e.retry_after_s),)
            return
        self._open += 1
        ended = False
        try:
            while not ended:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                ended = isinstance(batch[-1], (Finished, Failed))
                yield tuple(batch)
        finally:
            self._open -= 1
            if not ended:
                self.core.abort(rid)

    async def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    async def stop(self) -> None:
        """Every request still open ends with Failed."""
        if self._started is not None:
            await self.core.stop()

    async def _start(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self.core.start())
        await asyncio.shield(self._started)
