"""`ReplicaHost`: the engine replicas on Ray that several server processes share, for
`serve --http-workers N` with `engine.where: ray`, each attached through `attach_replicas(address)`.

The parent process launches the replicas and owns them: they live while it is connected to Ray, it
stops them when the server stops, and Ray restarts one that dies. Each server process connects to them
itself (engine/replicas/replica.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from engine.api import EngineError
from engine.profile import DeployProfile
from engine.remote.child import START_TIMEOUT_S
from engine.remote.messages import EngineSpec
from engine.replicas.cluster import RayAddress, RayCluster, new_namespace

log = logging.getLogger(__name__)


class ReplicaHost:
    """Owns the Ray cluster connection (and the Ray instance, `address: local`) and the replica actors."""

    def __init__(self, model: str, profile: DeployProfile, cache_dir: Path | None = None) -> None:
        self.spec = EngineSpec(model, profile.in_one_process(), cache_dir)
        self._cluster = RayCluster(profile.engine.replicas, new_namespace())
        self.address: RayAddress | None = None

    def start(self) -> None:
        """Launch the replicas and wait until each serves; EngineError if one does not."""
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        self._cluster.connect()
        actors = self._cluster.launch(self.spec)
        try:
            pids = ray.get([actor.ready.remote() for actor in actors], timeout=START_TIMEOUT_S)
        except (RayError, GetTimeoutError) as e:
            raise EngineError(f"the engine replicas did not start: {type(e).__name__}: {e}") from e
        self.address = self._cluster.address
        log.info("engine replicas ready for server processes (processes %s, namespace %s)", pids,
                 self.address.namespace)

    def stop(self) -> None:
        asyncio.run(self._cluster.stop_launched())
        self._cluster.shutdown()
