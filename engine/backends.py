"""The backends by name: the one place that reads the profile's `backend` key."""

from __future__ import annotations

from pathlib import Path

from engine.backend import Backend
from engine.profile import DeployProfile


def backend_for(model: str, profile: DeployProfile, cache_dir: Path | None = None) -> Backend:
    """`model`'s backend, opened: a Qwen3-Omni checkpoint (a local path, a hub id already in the local cache, or
    "tiny", built on first use) for `omni` and its `transformers_generate` baseline; the assistant's packages for
    `cascade`. Nothing loads its stages' weights before `load_core`."""
    # imported here: a server loads only its own backend's code and runtimes
    if profile.backend == "cascade":
        from engine.cascade.backend import CascadeBackend

        return CascadeBackend(profile, cache_dir)
    from engine.omni.backend import OmniBackend
    from engine.omni.weights.source import ModelSource

    return OmniBackend(ModelSource.open(model, profile.load_format, cache_dir), profile)
