"""The core that runs in this process: the staged engine, or the transformers baseline (the model loads
here), behind the admission gate."""

from __future__ import annotations

from engine.assemble import assemble
from engine.core import EngineCore
from engine.gate import Gate
from engine.profile import DeployProfile
from engine.reference import ReferenceCore
from engine.weights.source import ModelSource


def load_core(source: ModelSource, profile: DeployProfile) -> EngineCore:
    core = ReferenceCore.load(source, profile) if profile.backend == "transformers_generate" else assemble(source, profile)
    return Gate.for_profile(core, profile)
