"""The Thinker's vision tower over every image of a step at once.

The tower attends within each image, so one call over the step's images equals a call per image. It returns the
merged rows that take the images' placeholders and the "deepstack" rows the first decoder layers add at those
places. The patch embedding, a 3-D convolution whose kernel is its stride, runs as a matmul (`PatchMatmul`):
cuDNN would meet each new count of patches as a new convolution shape, which a request would wait for.

On a GPU a picture of a common size replays a CUDA graph of the tower captured at start-up for its grid
(`capture`): launched op by op, the tower's ~400 kernels each wait for the GIL, which the other stages' threads
hold, and a step with pictures took ~0.1 s of host time under load. A call whose every picture has a graph replays
one graph per picture; any other (a size seen rarely, a video) runs the tower eagerly over all of them at once."""

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
from engine.omni.runners.vision_layout import Grid, GridAttention, GridLayout

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
    # not blocking: from the host's pageable memory it is staged at once, where a blocking copy would wait for
    # everything queued on the stream before it
    x = image.pixels.to(device, non_blocking=True).permute(0, 3, 1, 2).float() / 255  # [frames, 3, height, width]
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
        self.graphs: dict[Grid, _Replay] = {}

    def __call__(self, images: list[ImageInput]) -> VisionRows:
        started = time.perf_counter()
        each = [patches(image, self.normalisation, temporal=self.temporal, patch=self.patch, device=self.device)
                for image in images]
        grids = [image.grid_thw for image in images]
        if self.graphs and all(grid in self.graphs for grid in grids):
            rows = self._replayed(each, grids)
        else:
            rows = self.forward(torch.cat(each), grids)
        if self.timed is not None:
            self.timed(time.perf_counter() - started)
        return rows

    def forward(self, pixels: torch.Tensor, grids: list[Grid]) -> VisionRows:
        """The tower eagerly over `pixels`, the patches of pictures of `grids`."""
        layout = GridLayout.of(self.tower, grids, self.device)
        for attention in self._attentions:  # each call says its lengths, whichever VisionTower made the layers
            attention.lengths = layout.lengths
        out = self.tower(pixels.to(self.dtype), grid_thw=layout.grid_thw, **layout.tensors)
        # transformers before 5.2x returns (merged rows, deepstack rows)
        embeds, deepstack = (out[0], out[1]) if isinstance(out, tuple) else (out.pooler_output, out.deepstack_features)
        return VisionRows(embeds, list(deepstack))

    def capture(self, grids: list[Grid]) -> int:
        """A CUDA graph of the tower over one picture of each grid, largest first into one pool; returns how many."""
        pool, stream = None, torch.cuda.Stream(self.device)
        for grid in sorted(set(grids), key=lambda g: g[0] * g[1] * g[2], reverse=True):
            self.graphs[grid] = _Replay.capture(self, grid, pool, stream)
            pool = self.graphs[grid].graph.pool()
        return len(self.graphs)

    def _replayed(self, each: list[torch.Tensor], grids: list[Grid]) -> VisionRows:
        """One replay per picture, its rows copied out before the next replay of its graph overwrites them."""
        sizes = [len(self.graphs[grid].rows.embeds) for grid in grids]
        like = self.graphs[grids[0]].rows
        embeds = like.embeds.new_empty(sum(sizes), like.embeds.shape[1])
        deepstack = [embeds.new_empty(sum(sizes), d.shape[1]) for d in like.deepstack]
        first = 0
        for pixels, grid, size in zip(each, grids, sizes, strict=True):
            replay = self.graphs[grid]
            replay.pixels.copy_(pixels)
            replay.graph.replay()
            embeds[first:first + size] = replay.rows.embeds
            for out, layer in zip(deepstack, replay.rows.deepstack, strict=True):
                out[first:first + size] = layer
            first += size
        return VisionRows(embeds, deepstack)


@dataclass(frozen=True, slots=True)
class _Replay:
    """One grid's graph: its input patches and its output rows, both static."""

    graph: torch.cuda.CUDAGraph
    pixels: torch.Tensor
    rows: VisionRows

    @classmethod
    def capture(cls, tower: VisionTower, grid: Grid, pool: Any, stream: torch.cuda.Stream) -> _Replay:
        t, h, w = grid
        pixels = torch.zeros(t * h * w, 3 * tower.temporal * tower.patch ** 2, dtype=tower.dtype, device=tower.device)
        stream.wait_stream(torch.cuda.current_stream(tower.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # cuBLAS's and SDPA's first calls set up what a capture may not
                tower.forward(pixels, [grid])
        torch.cuda.current_stream(tower.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            rows = tower.forward(pixels, [grid])
        return cls(graph, pixels, rows)
