"""Ray for the replicas: joined (or started, `address: local`) at the server's start, and one actor per
replica placed by Ray with the CPUs and GPUs the profile asks for each.

Ray is imported here and only here at start-up: a server without replicas never needs it installed.
Every node must have this package installed (the replicas' processes import it by name)."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from engine.profile import ReplicasConfig
from engine.remote.messages import EngineSpec
from engine.replicas.actor import ReplicaActor

log = logging.getLogger(__name__)

NAMESPACE = "voice-gateway"


class RayCluster:
    """Owns this server's connection to Ray (and the Ray instance, when it started one) and the replica
    actors it created."""

    def __init__(self, config: ReplicasConfig) -> None:
        self.config = config
        self.actors: list[Any] = []
        self._started_ray = False

    def connect(self) -> None:
        import ray

        cfg = self.config
        if ray.is_initialized():  # a process that already joined Ray (a test's): the replicas go there
            return
        if cfg.address == "local":
            # room for every replica even on a host with fewer cores: the profile chose how many
            num_cpus = max(os.cpu_count() or 1, math.ceil(cfg.count * cfg.cpus))
            ray.init(address="local", num_cpus=num_cpus, namespace=NAMESPACE, include_dashboard=False,
                     log_to_driver=True)
        else:
            ray.init(address=cfg.address, namespace=NAMESPACE, log_to_driver=True)
        self._started_ray = True
        log.info("Ray: %s, resources %s", cfg.address, ray.cluster_resources())

    def launch(self, spec: EngineSpec) -> list[Any]:
        """One actor per replica, each loading its engine in its own process; Ray restarts one that dies."""
        import ray

        cfg = self.config
        actor = ray.remote(ReplicaActor)
        self.actors = [
            actor.options(num_cpus=cfg.cpus, num_gpus=cfg.gpus, max_restarts=-1, max_task_retries=0,
                          max_concurrency=10_000).remote(spec)
            for _ in range(cfg.count)
        ]
        return self.actors

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self._started_ray:
            ray.shutdown()
