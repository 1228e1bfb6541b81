"""How a `RemoteCore` reaches one engine replica on Ray: Ray says where its channel is once it serves (`ready`), and
this process connects to it. Ray restarts a dead actor (`max_restarts=-1`); one that stalls is killed so that Ray
starts another. The actor belongs to the process that launched it: a core that stops only leaves it."""

from __future__ import annotations

import asyncio
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from typing import Any

import ray
from ray.exceptions import RayError

from engine.api import EngineError
from engine.profile import SupervisionConfig
from engine.remote.child import START_TIMEOUT_S
from engine.remote.client import Reach
from engine.remote.messages import STATE_PERIOD_S, EngineSpec
from engine.remote.reach import dial
from engine.replicas.actor import ReplicaChannel


class ReachReplica(Reach):
    """Holds the handle to one replica actor, and the pid its channel last gave."""

    recovery = "Ray is starting it again"

    def __init__(self, name: str, actor: Any) -> None:
        self.what = f"engine replica {name}"
        self.actor = actor
        self.pid: int | None = None

    async def open(self) -> tuple[Connection, EngineSpec]:
        try:
            channel: ReplicaChannel = await asyncio.wait_for(self.actor.ready.remote(), START_TIMEOUT_S)
            opened = await asyncio.wait_for(asyncio.to_thread(dial, channel.address, channel.authkey, self.what,
                                                              in_band=True), START_TIMEOUT_S)
        except (RayError, OSError, EOFError, AuthenticationError, TimeoutError) as e:
            raise EngineError(f"cannot reach {self.what}: {type(e).__name__}: {e}") from e
        self.pid = channel.pid
        self.ready = f"{self.what} ready (process {self.pid})"
        return opened

    def lost(self, stalled: bool) -> None:
        if stalled:
            ray.kill(self.actor, no_restart=False)  # Ray starts another

    def backoff_s(self, supervision: SupervisionConfig, attempts: int) -> float:
        return STATE_PERIOD_S
