"""Which engine a deploy profile asks for: the staged engine in this process or in its own, several of them
on Ray (engine/replicas/), or the baseline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.admission import Admission
from engine.api import Engine, EngineError
from engine.frontend import Frontend
from engine.profile import DeployProfile, ReplicasConfig
from engine.remote.client import RemoteCore
from engine.remote.messages import Address, EngineSpec
from engine.weights.source import ModelSource


def create_engine(model: str, profile: DeployProfile, cache_dir: Path | None = None) -> Engine:
    """Load `model`: a local path, a hub id already in the local cache, or "tiny" (built on first use).

    In process, the stages' weights load now; with `engine: process` they load in the child at start(), and
    with `replicas.count` in each replica's Ray actor at start()."""
    source = ModelSource.open(model, profile.load_format, cache_dir)
    if profile.replicas.count:
        # imported here: Ray is an optional extra, and only a server with replicas needs it
        try:
            from engine.replicas.router import ReplicaSet
        except ImportError as e:
            raise EngineError(f"replicas.count: engines on Ray need Ray ({e}); pip install 'voice-gateway[ray]'") from e

        spec = EngineSpec(model, dataclasses.replace(profile, replicas=ReplicasConfig()), cache_dir)
        return Frontend(ReplicaSet.on_ray(spec, profile.replicas), Admission.open(source, profile, text_on_loop=True))
    if profile.engine == "process":
        spec = EngineSpec(model, dataclasses.replace(profile, engine="in_process", http_workers=1), cache_dir)
        return Frontend(RemoteCore.spawn(spec), Admission.open(source, profile, text_on_loop=True))
    # imported here: a server process whose engine runs elsewhere never loads the stages, their kernels
    # or transformers' model code (uvicorn's worker health check gives a starting worker 5 s)
    from engine.local import load_core

    return Frontend(load_core(source, profile), Admission.open(source, profile, text_on_loop=False))


def attach_engine(address: Address) -> Engine:
    """An engine that an `EngineHost` in another process runs, reached at its `address`; this process
    learns the model and profile from it at start()."""
    core = RemoteCore.attach(address)

    def admission() -> Admission:
        spec = core.spec
        return Admission.open(ModelSource.open(spec.model, spec.profile.load_format, spec.cache_dir), spec.profile,
                              text_on_loop=True)

    return Frontend(core, admission)


def attach_replicas(gcs: str, namespace: str, count: int) -> Engine:
    """The engine replicas on Ray that a `ReplicaHost` in another process launched (Ray's GCS address, the
    server's namespace in it, how many); this process learns the model and profile from them at start()."""
    from engine.replicas.cluster import RayAddress
    from engine.replicas.router import ReplicaSet

    core = ReplicaSet.attached(RayAddress(gcs, namespace, count))

    def admission() -> Admission:
        spec = core.spec
        assert spec is not None, "replicas not started"
        return Admission.open(ModelSource.open(spec.model, spec.profile.load_format, spec.cache_dir), spec.profile,
                              text_on_loop=True)

    return Frontend(core, admission)
