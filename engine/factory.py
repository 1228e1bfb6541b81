"""Which engine a deploy profile asks for (`engine.where`): the staged engine (or the baseline) in this
process, in a child of its own, or several of them on Ray; and the engine that another process keeps for
this one's server processes (`serve --http-workers N`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine.admission import Admission
from engine.api import Engine, EngineError
from engine.frontend import Frontend
from engine.profile import DeployProfile
from engine.remote.client import RemoteCore
from engine.remote.messages import Address, EngineSpec
from engine.remote.reach import AttachHost, SpawnChild
from engine.replicas.cluster import RayAddress, RayCluster
from engine.weights.source import ModelSource

if TYPE_CHECKING:
    from engine.replicas.router import ReplicaSet


def create_engine(model: str, profile: DeployProfile, cache_dir: Path | None = None) -> Engine:
    """Load `model`: a local path, a hub id already in the local cache, or "tiny" (built on first use).

    In process, the stages' weights load now; in a child of its own they load there at start(), and on
    Ray in each replica's actor at start()."""
    if profile.backend == "cascade":
        # imported here: only the assistant's server loads its models and their runtimes
        from engine.cascade.assemble import assistant_engine

        return assistant_engine(profile, cache_dir)
    source = ModelSource.open(model, profile.load_format, cache_dir)
    spec = EngineSpec(model, profile.in_one_process(), cache_dir)
    if profile.engine.where == "ray":
        core = _replicas(RayCluster(profile.engine.replicas), spec)
        return Frontend(core, Admission.open(source, profile, text_on_loop=True))
    if profile.engine.where == "process":
        return Frontend(RemoteCore(SpawnChild(spec)), Admission.open(source, profile, text_on_loop=True))
    # imported here: a server process whose engine runs elsewhere never loads the stages, their kernels
    # or transformers' model code (uvicorn's worker health check gives a starting worker 5 s)
    from engine.local import load_core

    return Frontend(load_core(source, profile), Admission.open(source, profile, text_on_loop=False))


def attach_engine(address: Address) -> Engine:
    """An engine that an `EngineHost` in another process runs, reached at its `address`; this process
    learns the model and profile from it at start()."""
    return _attached(RemoteCore(AttachHost(address)))


def attach_replicas(address: RayAddress) -> Engine:
    """The engine replicas on Ray that a `ReplicaHost` in another process launched; this process learns
    the model and profile from them at start()."""
    return _attached(_replicas(RayCluster.at(address), None))


def _attached(core: RemoteCore | ReplicaSet) -> Engine:
    def admission() -> Admission:
        spec = core.spec
        return Admission.open(ModelSource.open(spec.model, spec.profile.load_format, spec.cache_dir), spec.profile,
                              text_on_loop=True)

    return Frontend(core, admission)


def _replicas(cluster: RayCluster, launch: EngineSpec | None) -> ReplicaSet:
    # imported here: Ray is an optional extra, and only a server with replicas needs it
    try:
        from engine.replicas.router import ReplicaSet
    except ImportError as e:
        raise EngineError(f"engine.where: ray needs Ray ({e}); pip install 'voice-gateway[ray]'") from e
    return ReplicaSet(cluster, launch)
