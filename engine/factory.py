"""Where a deploy profile runs its engine (`engine.where`): its backend's stages in this process, in a child of
their own, or several engines on Ray; and the engine that another process keeps for this one's server processes
(`serve --http-workers N`). Every topology is the same front end over a different core."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine.api import Engine, EngineError
from engine.backends import backend_for
from engine.frontend import Frontend
from engine.intake.intake import Intake
from engine.profile import DeployProfile
from engine.remote.client import RemoteCore
from engine.remote.messages import Address, EngineSpec
from engine.remote.reach import AttachHost, SpawnChild
from engine.replicas.cluster import RayAddress, RayCluster

if TYPE_CHECKING:
    from engine.replicas.router import ReplicaSet


def create_engine(model: str, profile: DeployProfile, cache_dir: Path | None = None) -> Engine:
    """Load `model` (engine/backends.py says what it may be). In process, the stages' weights load now; in a
    child of its own they load there at start(), and on Ray in each replica's actor at start()."""
    backend = backend_for(model, profile, cache_dir)
    spec = EngineSpec(model, profile.in_one_process(), cache_dir)
    if profile.engine.where == "ray":
        return Frontend(_replicas(RayCluster(profile.engine.replicas), spec), backend.intake(text_on_loop=True))
    if profile.engine.where == "process":
        return Frontend(RemoteCore(SpawnChild(spec)), backend.intake(text_on_loop=True))
    return Frontend(backend.load_core(), backend.intake(text_on_loop=False))


def attach_engine(address: Address) -> Engine:
    """An engine that an `EngineHost` in another process runs, reached at its `address`; this process
    learns the model and profile from it at start()."""
    return _attached(RemoteCore(AttachHost(address)))


def attach_replicas(address: RayAddress) -> Engine:
    """The engine replicas on Ray that a `ReplicaHost` in another process launched; this process learns
    the model and profile from them at start()."""
    return _attached(_replicas(RayCluster.at(address), None))


def _attached(core: RemoteCore | ReplicaSet) -> Engine:
    def intake() -> Intake:
        spec = core.spec
        return backend_for(spec.model, spec.profile, spec.cache_dir).intake(text_on_loop=True)

    return Frontend(core, intake)


def _replicas(cluster: RayCluster, launch: EngineSpec | None) -> ReplicaSet:
    # imported here: Ray is an optional extra, and only a server with replicas needs it
    try:
        from engine.replicas.router import ReplicaSet
    except ImportError as e:
        raise EngineError(f"engine.where: ray needs Ray ({e}); pip install 'voice-gateway[ray]'") from e
    return ReplicaSet(cluster, launch)
