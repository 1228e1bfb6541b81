"""One engine replica as a Ray actor: its backend's core in the actor's own process, served to every server process
over a TCP connection of its own (engine/remote/service.py), the channel `engine.where: process` has over a pipe.

Ray places the actor, restarts it when it dies, and tells each server process where its channel is (`ready`);
requests, their events and the replica's state never pass through Ray, whose every call is work for both
processes' Ray threads beside the engine's. The channel is authenticated with a key only the actor and Ray
know. Ray runs it as an async actor, so every method runs on the actor's one event loop, where a core expects
`begin`, `abort` and its sinks. Ray is not imported here: cluster.py wraps the class with `ray.remote`."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from engine.backends import backend_for
from engine.remote.heap import freeze_startup_heap
from engine.remote.messages import EngineSpec
from engine.remote.service import CoreService


@dataclass(frozen=True, slots=True)
class ReplicaChannel:
    """Where a server process reaches the replica: its process, its TCP address and the key it asks for."""

    pid: int
    address: tuple[str, int]
    authkey: bytes


class ReplicaActor:
    """Owns one core, loaded when Ray creates (or restarts) the actor, and its service, started on the first call."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        # the replica's process alone loads the stages
        self.core = backend_for(spec.model, spec.profile, spec.cache_dir).load_core()
        self._started: asyncio.Future[ReplicaChannel] | None = None
        self._service: CoreService | None = None

    async def ready(self) -> ReplicaChannel:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._started)

    async def stop(self) -> None:
        """Every request still open ends with Failed, and its end goes out."""
        if self._service is not None:
            await self._service.stop()

    async def _start(self) -> ReplicaChannel:
        import ray

        await self.core.start()
        freeze_startup_heap()  # the actor's process ends with it: nothing to thaw
        self._service = CoreService(self.core, self.spec, asyncio.get_running_loop())
        authkey = os.urandom(32)
        address = self._service.listen((ray.util.get_node_ip_address(), 0), authkey, in_band=True)
        return ReplicaChannel(os.getpid(), address, authkey)
