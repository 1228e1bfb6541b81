"""What the vision tower costs a step of pictures (`voice-gateway vision`): transformers' own tower against the
engine's (`VisionTower`: grids laid out on the host, one attention call a layer for pictures of one size) and, on a
GPU, the engine's replaying its graph of the camera's grid once per picture, by how many 1280x720 camera pictures
the step carries, each resized as the profile resizes it.

Each call is timed from its start until the device has finished it (the median of the replays). The tower's
weights are random at the model's dimensions: their values do not change the time."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling

from engine.handoff import ImageInput
from engine.intake.images import ImagePreprocessor
from engine.omni.runners.vision_tower import Normalisation, VisionTower, patches
from engine.omni.weights.source import ModelSource
from engine.profile import ThinkerConfig

PICTURES = (1, 2, 4, 16)
FORMS = ("transformers", "engine", "graphed")
CAMERA = (720, 1280)  # height, width
WARM_CALLS = 2


@dataclass(frozen=True, slots=True)
class VisionTiming:
    form: str  # "transformers": its tower as it comes; "engine": VisionTower; "graphed": VisionTower's graphs
    pictures: int  # in one call
    patches: int  # the call's patches over all its pictures
    call_ms: float

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def measure(model: str = "tiny", *, load_format: str = "auto", device: str = "cpu",
            pictures: tuple[int, ...] = PICTURES, replays: int = 10, cache_dir: Path | None = None) -> list[VisionTiming]:
    """Both forms for every count of pictures: bf16 on a GPU, float32 on the CPU."""
    vision_config = ModelSource.open(model, load_format, cache_dir).config.thinker_config.vision_config  # type: ignore[arg-type]
    limits = ThinkerConfig()
    resize = ImagePreprocessor(vision_config, min_pixels=limits.image_min_pixels, max_pixels=limits.image_max_pixels)
    rng = np.random.default_rng(0)
    frames = [resize((rng.random((*CAMERA, 3)) * 255).astype(np.uint8), -1 - i) for i in range(max(pictures))]
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        encoder = modeling.Qwen3OmniMoeVisionEncoder._from_config(vision_config, dtype=dtype).eval()
    timings = [_timing("transformers", _plain(encoder, vision_config), frames[:n], replays) for n in pictures]
    engine = VisionTower(SimpleNamespace(visual=encoder))  # from here on the encoder's layers are the engine's
    timings += [_timing("engine", engine, frames[:n], replays) for n in pictures]
    if device.startswith("cuda"):
        with torch.inference_mode():
            engine.capture([frames[0].grid_thw])
        timings += [_timing("graphed", engine, frames[:n], replays) for n in pictures]
    return timings


def _plain(encoder: Any, vision_config: Any) -> Any:
    """transformers' tower called as its model calls it: patches, then the grids as a device tensor."""
    param = next(encoder.parameters())

    def call(images: list[ImageInput]) -> Any:
        pixels = torch.cat([patches(i, Normalisation(), temporal=vision_config.temporal_patch_size,
                                    patch=vision_config.patch_size, device=param.device) for i in images])
        return encoder(pixels.to(param.dtype), grid_thw=torch.tensor([i.grid_thw for i in images], device=param.device))

    return call


def _timing(form: str, tower: Any, images: list[ImageInput], replays: int) -> VisionTiming:
    times = []
    with torch.inference_mode():
        for i in range(WARM_CALLS + replays):
            _sync()
            started = time.perf_counter()
            tower(images)
            _sync()
            if i >= WARM_CALLS:
                times.append(time.perf_counter() - started)
    return VisionTiming(form, len(images), sum(int(np.prod(i.grid_thw)) for i in images),
                        round(1e3 * statistics.median(times), 3))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
