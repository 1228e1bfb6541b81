"""Ray for the replicas: joined (or started, `address: local`) at the server's start, and one named actor per
replica, placed by Ray with the CPUs and GPUs the profile asks for each.

The actors are named in a namespace of the server's own, so the server processes of `serve --http-workers N`
share them: the parent launches them (`ReplicaHost`) and owns them, and each server process attaches through
`attach_replicas(address)`. Ray is imported here only, at start-up: a server without replicas never needs it.
Every node must have this package installed (the replicas' processes import it by name)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import EngineError
from engine.profile import DeployProfile, ReplicasConfig
from engine.remote.child import START_TIMEOUT_S
from engine.remote.messages import EngineSpec
from engine.replicas.actor import ReplicaActor

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class RayAddress:
    """Where a server's replicas are: the Ray cluster's GCS address and the server's namespace in it."""

    gcs: str
    namespace: str
    count: int


class RayCluster:
    """Owns this process's Ray connection (and instance, if it started one) and the replica actors it launched."""

    def __init__(self, config: ReplicasConfig, namespace: str | None = None) -> None:
        self.config = config
        self.namespace = namespace or f"voice-gateway-{os.getpid()}-{secrets.token_hex(4)}"
        self._launched: list[Any] = []
        self._connected = False

    @classmethod
    def at(cls, address: RayAddress) -> RayCluster:
        return cls(ReplicasConfig(count=address.count, address=address.gcs), address.namespace)

    def connect(self, log_to_driver: bool = True) -> None:
        import ray

        cfg = self.config
        if ray.is_initialized():  # a process that already joined Ray (a test's): the replicas go there
            return
        # ray.init sets a SIGTERM handler that exits at once; the server's own (uvicorn's) stops it in
        # order, its requests ended and the replicas stopped, so it is put back
        on_sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        if cfg.address == "local":
            # room for every replica even on a host with fewer cores: the profile chose how many
            num_cpus = max(os.cpu_count() or 1, math.ceil(cfg.count * cfg.cpus))
            ray.init(address="local", num_cpus=num_cpus, namespace=self.namespace, include_dashboard=False,
                     log_to_driver=log_to_driver, _system_config={"worker_niceness": 0})
        else:
            ray.init(address=cfg.address, namespace=self.namespace, log_to_driver=log_to_driver)
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)
        self._connected = True
        log.info("Ray: %s, namespace %s, resources %s", cfg.address, self.namespace, ray.cluster_resources())

    def launch(self, spec: EngineSpec) -> list[Any]:
        import ray

        cfg = self.config
        actor = ray.remote(ReplicaActor)
        self._launched = [
            actor.options(name=_name(i), namespace=self.namespace, get_if_exists=True, num_cpus=cfg.cpus,
                          num_gpus=cfg.gpus, max_restarts=-1, max_task_retries=0,
                          max_concurrency=10_000).remote(spec)
            for i in range(cfg.count)
        ]
        return self._launched

    def lookup(self) -> list[Any]:
        import ray

        return [ray.get_actor(_name(i), namespace=self.namespace) for i in range(self.config.count)]

    async def stop(self) -> None:
        """Each actor this process launched fails what it holds and is killed; then leave Ray (stopping it if ours)."""
        import ray
        from ray.exceptions import RayError

        calls = [actor.stop.remote() for actor in self._launched]
        with contextlib.suppress(RayError, TimeoutError):
            await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), STOP_TIMEOUT_S)
        for actor in self._launched:
            ray.kill(actor, no_restart=True)
        self._launched = []
        if self._connected:
            ray.shutdown()
            self._connected = False


def _name(index: int) -> str:
    return f"replica-{index}"


class ReplicaHost:
    """Owns the Ray connection (and instance, `address: local`) and the replica actors server processes share."""

    def __init__(self, model: str, profile: DeployProfile, cache_dir: Path | None = None) -> None:
        self.spec = EngineSpec(model, profile.in_one_process(), cache_dir)
        self._cluster = RayCluster(profile.engine.replicas)
        self.address: RayAddress | None = None

    def start(self) -> None:
        """Launch the replicas and wait until each serves; EngineError if one does not."""
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        self._cluster.connect()
        actors = self._cluster.launch(self.spec)
        try:
            channels = ray.get([actor.ready.remote() for actor in actors], timeout=START_TIMEOUT_S)
        except (RayError, GetTimeoutError) as e:
            raise EngineError(f"the engine replicas did not start: {type(e).__name__}: {e}") from e
        self.address = RayAddress(ray.get_runtime_context().gcs_address, self._cluster.namespace, len(actors))
        log.info("engine replicas ready for server processes (processes %s, namespace %s)",
                 [channel.pid for channel in channels], self.address.namespace)

    def stop(self) -> None:
        asyncio.run(self._cluster.stop())
