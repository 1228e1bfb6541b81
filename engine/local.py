"""The core that runs in this process: the staged engine, or the transformers baseline (the model loads here)."""

from __future__ import annotations

from engine.assemble import assemble
from engine.core import EngineCore
from engine.profile import DeployProfile
from engine.reference import ReferenceCore
from engine.weights.source import ModelSource


def load_core(source: ModelSource, profile: DeployProfile) -> EngineCore:
    if profile.backend == "transformers_generate":
        return ReferenceCore.load(source, profile)
    return assemble(source, profile)
