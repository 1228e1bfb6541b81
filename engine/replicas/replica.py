"""How a `RemoteCore` (engine/remote/client.py) reaches one engine replica on Ray (engine/replicas/actor.py):
Ray says where the replica's channel is once it serves (`ready`); this process connects to it, and submits,
cancels and hears the replica's state on it as on any engine's connection.

When the actor dies its channel closes: Ray starts it again (it is created with `max_restarts=-1`), and the
core looks for it every `STATE_PERIOD_S` until it answers `ready`. One that stalls is killed so that Ray
starts another. The actor belongs to the process that launched it (engine/replicas/cluster.py): a core
that stops leaves it running, and the replica aborts what that connection had open.
"""

from __future__ import annotations

import asyncio
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from typing import Any

import ray
from ray.exceptions import RayError

from engine.api import EngineError
from engine.profile import SupervisionConfig
from engine.remote.child import START_TIMEOUT_S
from engine.remote.messages import STATE_PERIOD_S, EngineSpec
from engine.remote.pipe import cut, portable
from engine.remote.reach import handshake
from engine.replicas.actor import ReplicaChannel


class ReachReplica:
    """Holds the handle to one replica actor, and the pid its channel last gave."""

    verb = "reconnect"
    recovery = "Ray is starting it again"
    owns_engine = False

    def __init__(self, name: str, actor: Any) -> None:
        self.what = f"engine replica {name}"
        self.actor = actor
        self.pid: int | None = None

    @property
    def ready(self) -> str:
        return f"{self.what} ready (process {self.pid})"

    async def open(self) -> tuple[Connection, EngineSpec]:
        try:
            channel: ReplicaChannel = await asyncio.wait_for(self.actor.ready.remote(), START_TIMEOUT_S)
            return await asyncio.wait_for(asyncio.to_thread(self._dial, channel), START_TIMEOUT_S)
        except (RayError, OSError, EOFError, AuthenticationError, TimeoutError) as e:
            raise EngineError(f"cannot reach {self.what}: {type(e).__name__}: {e}") from e

    def _dial(self, channel: ReplicaChannel) -> tuple[Connection, EngineSpec]:
        conn = portable(Client(channel.address, authkey=channel.authkey))
        try:
            spec = handshake(conn, self.what)
        except BaseException:
            cut(conn)
            raise
        self.pid = channel.pid
        return conn, spec

    def lost(self, stalled: bool) -> None:
        if stalled:
            ray.kill(self.actor, no_restart=False)  # Ray starts another

    async def reap(self) -> None:
        pass  # Ray's to reap

    def backoff_s(self, supervision: SupervisionConfig, attempts: int) -> float:
        return STATE_PERIOD_S
