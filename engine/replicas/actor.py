"""One engine replica as a Ray actor: a core (engine/local.py) in the actor's own process, each request's
events streamed back to the server in batches, and its state (stage load, metrics, health) on demand.

Ray runs it as an async actor, so every method runs on the actor's one event loop, which is where a
core expects `begin`, `abort` and its sinks. This module does not import Ray: engine/replicas/cluster.py
wraps the class with `ray.remote` where Ray is installed, and a worker imports it by name.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from prometheus_client import generate_latest

from engine.api import EngineError, EngineHealth, Failed, Finished, OutputEvent
from engine.handoff import AdmittedRequest
from engine.remote.messages import EngineSpec
from engine.weights.source import ModelSource

# (stage load, the engine's Prometheus families as text, its health): what a poll returns
ReplicaState = tuple[dict[str, int], str, EngineHealth]


class ReplicaActor:
    """Owns one core, loaded when Ray creates the actor (and again each time Ray restarts it), started
    on its first call."""

    def __init__(self, spec: EngineSpec) -> None:
        from engine.local import load_core  # the replica's process alone loads the stages

        source = ModelSource.open(spec.model, spec.profile.load_format, spec.cache_dir)
        self.core = load_core(source, spec.profile)
        self._started: asyncio.Future[None] | None = None

    async def ready(self) -> int:
        """Once the core serves: this process's id."""
        await self._start()
        return os.getpid()

    async def state(self) -> ReplicaState:
        await self._start()
        return self.core.stage_load(), generate_latest(self.core.registry).decode(), self.core.health()

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
        ended = False
        try:
            while not ended:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                ended = isinstance(batch[-1], (Finished, Failed))
                yield tuple(batch)
        finally:
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
