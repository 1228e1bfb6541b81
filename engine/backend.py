"""What a backend is to the core: the one object that builds an engine's stages and says what it can do.

The staged Qwen3-Omni engine and the CPU assistant's cascade serve behind the same front end, intake and gate. The
core asks a backend and never which one runs: `info` (its inputs, voices, context), `intake` (its front door),
`load_core` (its stages in this process). engine/backends.py alone picks one, by the profile's `backend` key."""

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
