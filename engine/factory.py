"""Which engine a deploy profile asks for: the staged engine in this process or in its own, or the baseline."""

from __future__ import annotations

from pathlib import Path

from engine.api import Engine
from engine.profile import DeployProfile


def create_engine(model: str, profile: DeployProfile, cache_dir: Path | None = None) -> Engine:
    """Load `model`: a local path, a hub id already in the local cache, or "tiny" (built on first use)."""
    if profile.engine_process:
        from engine.process import EngineProcess

        return EngineProcess(model, profile, cache_dir)  # loads the model in its child at start()
    if profile.backend == "transformers_generate":
        from engine.reference import ReferenceEngine

        return ReferenceEngine.from_model(model, profile, cache_dir)
    from engine.orchestrator import Orchestrator

    return Orchestrator.from_model(model, profile, cache_dir)


def attach_engine(address: tuple[str, bytes]) -> Engine:
    """An engine that an `EngineHost` in another process runs, reached at its `address`."""
    from engine.process import EngineProcess

    return EngineProcess("attached", attach=address)
