"""The Thinker's vision tower over every image of a step at once.

The tower attends within each image, so one call over the step's images equals a call per image. It returns the
merged rows that take the images' placeholders and the "deepstack" rows the first decoder layers add at those
places. The patch embedding, a 3-D convolution whose kernel is its stride, runs as a matmul (`PatchMatmul`):
cuDNN would meet each new count of patches as a new convolution shape, which a request would wait for."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.handoff import ImageInput
from engine.omni.runners.vision_layout import GridAttention, GridLayout

# Qwen3-Omni's vision tower normalises pixels to [-1, 1] (Qwen3-VL's processor settings)
_MEAN_STD = (0.5, 0.5, 0.5)

@dataclass(frozen=True, slots=True)
class Normalisation:
    """How the tower's processor scales pixels: (x / 255 - mean) / std per channel."""

    mean: tuple[float, ...] = _MEAN_STD
    std: tuple[float, ...] = _MEAN_STD

    @classmethod
    def for_checkpoint(cls, path: Path) -> Normalisation:
        """The one the checkpoint's `preprocessor_config.json` names, where it names one."""
        config = path / "preprocessor_config.json"
        if config.exists():
            saved = json.loads(config.read_text())
            if "image_mean" in saved and "image_std" in saved:
                return cls(tuple(saved["image_mean"]), tuple(saved["image_std"]))
        return cls()


QWEN_NORMALISATION = Normalisation()


@functools.lru_cache(maxsize=8)
def _mean_std(normalisation: Normalisation, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[3, 1, 1] each, made once per device rather than copied to it with every image."""
    return (torch.tensor(normalisation.mean, device=device)[:, None, None],
            torch.tensor(normalisation.std, device=device)[:, None, None])


def patches(image: ImageInput, normalisation: Normalisation, *, temporal: int, patch: int,
            device: torch.device | str | None = None) -> torch.Tensor:
    """[patches, 3 * temporal * patch * patch] float32 on `device`: what transformers' Qwen2-VL image processor makes
    of the resized pixels (scaled, normalised, each merge x merge block of patches in raster order, a patch's
    values (channel, frame, row, column); an image repeated over the temporal patch)."""
    t, h, w = image.grid_thw
    m = image.merge
    x = image.pixels.to(device).permute(0, 3, 1, 2).float() / 255  # [frames, 3, height, width]
    mean, std = _mean_std(normalisation, x.device)
    x = (x - mean) / std
    if x.shape[0] == 1:
        x = x.expand(temporal * t, -1, -1, -1)
    x = x.reshape(t, temporal, 3, h // m, m, patch, w // m, m, patch)
    return x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(t * h * w, 3 * temporal * patch * patch)


@dataclass(frozen=True, slots=True)
class VisionRows:
    embeds: torch.Tensor  # [tokens, H]: the placeholders' rows, image after image
    deepstack: list[torch.Tensor]  # per deepstack layer, [tokens, H]: added after decoder layer k


class PatchMatmul(torch.nn.Module):
    """The patch embedding, [patches, C * T * P * P] -> [patches, hidden], as one matmul over the conv's weights."""

    def __init__(self, conv: torch.nn.Conv3d) -> None:
        super().__init__()
        self.weight = conv.weight.view(conv.weight.shape[0], -1)
        self.bias = conv.bias

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(pixels.to(self.weight.dtype), self.weight, self.bias)


class VisionTower:
    """`normalisation`: the checkpoint's, for the images' pixels; `timed`: told the host time of each call."""

    def __init__(self, thinker: Any, *, normalisation: Normalisation = QWEN_NORMALISATION,
                 timed: Callable[[float], None] | None = None) -> None:
        # transformers 5.2x keeps the towers under `thinker.model`
        self.tower = getattr(thinker, "visual", None) or thinker.model.visual
        if isinstance(getattr(self.tower.patch_embed, "proj", None), torch.nn.Conv3d):
            self.tower.patch_embed = PatchMatmul(self.tower.patch_embed.proj)
        param = next(self.tower.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.normalisation = normalisation
        self.temporal, self.patch = self.tower.config.temporal_patch_size, self.tower.config.patch_size
        self.timed = timed
        for block in self.tower.blocks:
            if not isinstance(block.attn, GridAttention):
                block.attn = GridAttention(block.attn)
        self._attentions: list[GridAttention] = [block.attn for block in self.tower.blocks]

    def __call__(self, images: list[ImageInput]) -> VisionRows:
        started = time.perf_counter()
        pixels = torch.cat([patches(image, self.normalisation, temporal=self.temporal, patch=self.patch,
                                    device=self.device) for image in images]).to(self.dtype)
        grids = [tuple(image.grid_thw) for image in images]
        layout = GridLayout.of(self.tower, grids, self.device)  # type: ignore[arg-type]
        for attention in self._attentions:  # each call says its lengths, whichever VisionTower made the layers
            attention.lengths = layout.lengths
        out = self.tower(pixels, grid_thw=layout.grid_thw, **layout.tensors)
        # transformers before 5.2x returns (merged rows, deepstack rows)
        embeds, deepstack = (out[0], out[1]) if isinstance(out, tuple) else (out.pooler_output, out.deepstack_features)
        if self.timed is not None:
            self.timed(time.perf_counter() - started)
        return VisionRows(embeds, list(deepstack))
