"""What a backend is to the core: the one object that builds an engine's stages and says what it can do.

Two backends serve behind the same front end, intake and gate: the staged Qwen3-Omni engine (engine/omni/) and
the CPU assistant's cascade (engine/cascade/). The core asks a backend and never which one runs: `info` says what
it can do (the inputs it takes, its voices, its context), `intake` is its front door, `load_core` its stages in
this process. engine/backends.py is the one place that picks a backend by the profile's `backend` key.
"""

from __future__ import annotations

from typing import Protocol

from engine.api import ModelInfo
from engine.core import EngineCore
from engine.intake.intake import Intake


class Backend(Protocol):
    @property
    def info(self) -> ModelInfo:
        """What it can do: its inputs (audio, and images and video where `max_image_pixels` > 0) and voices."""
        ...

    def intake(self, *, text_on_loop: bool) -> Intake:
        """Its front door, in the server's process, also when its stages run in another one."""
        ...

    def load_core(self) -> EngineCore:
        """Its stages, loaded in this process, behind the gate that keeps their replies within their batch."""
        ...
