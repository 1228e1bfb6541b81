"""Images and videos -> what the Thinker takes: pixel patches, the prompt's placeholders, M-RoPE's 3-D positions.

Pixels go through transformers' own Qwen2-VL image processor (the one Qwen3-Omni's processor holds), resized
so that the image's pixels lie within the profile's budget (`min_pixels`, `max_pixels`): each placeholder
stands for a 2x2 merge of 16x16 patches, 32x32 pixels. An image becomes `<|vision_start|>`, one
`<|image_pad|>` per merged patch, `<|vision_end|>`. A video is its frames two by two (the tower's temporal
patch), each frame resized and normalised by the same processor: `<|video_pad|>` placeholders, one per merged
patch of each pair. A video with its sound (`use_audio_in_video`) becomes `<|vision_start|><|audio_start|>`, its
`<|video_pad|>` and `<|audio_pad|>` placeholders interleaved by time (each frame pair's at its start time, each
audio token at its own: one position per audio token), `<|audio_end|><|vision_end|>`, as Qwen3-Omni's processor
lays it out.

Positions: text and audio advance M-RoPE's three rows together, one per token. An image's placeholders take
(t, h, w) = (start, start + row, start + column) over its merged grid (a video's t also steps by its frame
pairs' time: seconds x the model's 13 positions a second), and what follows the image starts
after the largest of them (transformers' `get_rope_index`): a prompt with images takes fewer positions than
tokens, and its reply continues from there (`Rope`). A prompt's positions depend only on what comes
before them, so a kept prefix holds the same positions in every turn that begins with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.api import EngineError

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_END = "<|vision_end|>"
# Qwen3-Omni's vision tower normalises pixels to [-1, 1] (Qwen3-VL's processor settings)
_MEAN_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image as the vision tower takes it: `pixel_values` [patches, 3 * 2 * 16 * 16] and its patch grid
    (t, h, w); `key`: a digest of its pixels, negative so that no token id equals it (prefix reuse)."""

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    key: int
    merge: int = 2
    # a video: M-RoPE time positions from one frame pair to the next; 0 for an image (one moment)
    time_step: int = 0
    is_video: bool = False
    audio_tokens: int = 0  # a video with its sound: the sound's placeholders, interleaved with the frames'

    @property
    def grid(self) -> Grid:
        return Grid(self.grid_thw, self.time_step, self.audio_tokens)

    @property
    def tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (self.merge * self.merge)


class ImagePreprocessor:
    """Pixels -> `ImageInput`, within a pixel budget, by transformers' Qwen2-VL image processor (its PIL backend
    where transformers has one: no torchvision needed)."""

    def __init__(self, vision_config: Any, *, min_pixels: int, max_pixels: int,
                 mean_std: tuple[tuple[float, ...], tuple[float, ...]] = (_MEAN_STD, _MEAN_STD)) -> None:
        self.merge = vision_config.spatial_merge_size
        self.temporal = vision_config.temporal_patch_size  # frames in one of the tower's patches
        try:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as Cls
        except ImportError:  # transformers before the PIL backends: the torchvision one
            from transformers import Qwen2VLImageProcessor as Cls  # type: ignore[assignment]
        self.processor = Cls(patch_size=vision_config.patch_size, temporal_patch_size=vision_config.temporal_patch_size,
                             merge_size=self.merge, min_pixels=min_pixels, max_pixels=max_pixels,
                             image_mean=list(mean_std[0]), image_std=list(mean_std[1]))

    @classmethod
    def for_checkpoint(cls, path: Path, vision_config: Any, *, min_pixels: int, max_pixels: int) -> ImagePreprocessor:
        """With the normalisation the checkpoint's `preprocessor_config.json` names, where it names one."""
        mean_std = (_MEAN_STD, _MEAN_STD)
        config = path / "preprocessor_config.json"
        if config.exists():
            saved = json.loads(config.read_text())
            if "image_mean" in saved and "image_std" in saved:
                mean_std = (tuple(saved["image_mean"]), tuple(saved["image_std"]))
        return cls(vision_config, min_pixels=min_pixels, max_pixels=max_pixels, mean_std=mean_std)

    def __call__(self, pixels: np.ndarray, key: int) -> ImageInput:
        """`key`: the image's digest (negative, so that no token id equals it)."""
        if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
            raise EngineError(f"an image must be RGB uint8 [height, width, 3], got {pixels.dtype} {list(pixels.shape)}")
        if min(pixels.shape[:2]) < 2:
            raise EngineError(f"an image must be at least 2x2 pixels, got {pixels.shape[1]}x{pixels.shape[0]}")
        try:
            out = self.processor(images=[pixels], return_tensors="pt")
        except ValueError as e:  # e.g. an aspect ratio past 200:1
            raise EngineError(f"cannot use this image: {e}") from e
        t, h, w = (int(v) for v in out["image_grid_thw"][0])
        return ImageInput(out["pixel_values"], (t, h, w), key, self.merge)

    def video(self, frames: np.ndarray, fps: float, key: int, positions_per_second: int) -> ImageInput:
        """Frames [n, height, width, 3] uint8 sampled at `fps` -> the tower's input: each frame through the image
        processor, then `temporal` at a time into the tower's temporal patches (the last frame repeated to fill the
        last one, as Qwen's processors pad)."""
        if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8 or not len(frames):
            raise EngineError(f"a video is RGB uint8 frames [n, height, width, 3], got {frames.dtype} "
                              f"{list(frames.shape)}")
        step = self.temporal / fps * positions_per_second
        if step != round(step):
            raise EngineError(f"a video's frame rate must give whole position steps, got {fps:g} frames a second")
        if pad := -len(frames) % self.temporal:
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        groups = len(frames) // self.temporal
        per_frame = [self(frame, key) for frame in frames]
        rows, channels = per_frame[0].pixel_values.shape[0], 3
        # an image's rows hold it `temporal` times over the patch (C, T, P, P): one copy of each frame, grouped
        singles = torch.stack([f.pixel_values.view(rows, channels, self.temporal, -1)[:, :, 0] for f in per_frame])
        patches = singles.view(groups, self.temporal, rows, channels, -1).permute(0, 2, 3, 1, 4)
        _, h, w = per_frame[0].grid_thw
        return ImageInput(patches.reshape(groups * rows, -1), (groups, h, w), key, self.merge, time_step=round(step),
                          is_video=True)


@dataclass(frozen=True, slots=True)
class Grid:
    """An image's or video's patch grid (t, h, w), its time step (ImageInput.time_step) and the audio tokens
    interleaved with it (a video with its sound)."""

    thw: tuple[int, int, int]
    time_step: int = 0
    audio: int = 0


def _interleaved(grid: Grid, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """A span's (t, h, w) rows from 0 [3, n] and which of its tokens are the video's [n]: the frames' tokens at
    their pair's time and the sound's at one position each, in time order (a frame's token first at a tie)."""
    t, h, w = grid.thw
    gh, gw = h // merge, w // merge
    video = np.stack([np.broadcast_to(np.arange(t)[:, None, None] * grid.time_step, (t, gh, gw)),
                      np.broadcast_to(np.arange(gh)[None, :, None], (t, gh, gw)),
                      np.broadcast_to(np.arange(gw)[None, None, :], (t, gh, gw))]).reshape(3, -1)
    if not grid.audio:
        return video, np.ones(video.shape[1], dtype=bool)
    rows = np.concatenate([video, np.broadcast_to(np.arange(grid.audio), (3, grid.audio))], axis=1)
    is_video = np.arange(rows.shape[1]) < video.shape[1]
    order = np.lexsort((~is_video, rows[0]))  # stable: each kind keeps its own order
    return rows[:, order], is_video[order]


def image_positions(start: int, grid: Grid, merge: int) -> np.ndarray:
    """[3, tokens]: the (t, h, w) rows of an image's (or video's) placeholders that begin at position `start`."""
    return _interleaved(grid, merge)[0] + start


def video_layout(grid: Grid, merge: int) -> np.ndarray:
    """[tokens]: which of a video-with-sound's placeholders are the frames' (the rest are the sound's)."""
    return _interleaved(grid, merge)[1]


def mrope_positions(length: int, image_spans: list[tuple[int, int]], grids: list[Grid], merge: int) -> np.ndarray:
    """[3, length]: M-RoPE's rows for a prompt whose images and videos (of these grids) lie at `image_spans`."""
    parts, at, next_pos = [], 0, 0
    for (a, b), grid in zip(image_spans, grids, strict=True):
        parts.append(np.broadcast_to(np.arange(next_pos, next_pos + a - at), (3, a - at)))
        next_pos += a - at
        rows = image_positions(next_pos, grid, merge)
        assert rows.shape[1] == b - a, (a, b, grid)
        parts.append(rows)
        next_pos, at = int(rows.max()) + 1, b
    parts.append(np.broadcast_to(np.arange(next_pos, next_pos + length - at), (3, length - at)))
    return np.concatenate(parts, axis=1)


@dataclass(frozen=True, slots=True)
class Rope:
    """A prompt's M-RoPE rows [3, L] where they are not its positions (it holds images), and what follows it: the
    reply's position p takes p + `delta` in all three rows."""

    rows: np.ndarray
    delta: int

    @classmethod
    def of(cls, rows: np.ndarray) -> Rope:
        return cls(rows, int(rows.max()) + 1 - rows.shape[1])

    def at(self, start: int, n: int) -> np.ndarray:
        """[3, n]: the rows of positions [start, start + n), a piece of the prompt or what follows it."""
        if start < self.rows.shape[1]:
            assert start + n <= self.rows.shape[1], (start, n, self.rows.shape)
            return self.rows[:, start : start + n]
        return np.broadcast_to(np.arange(start + self.delta, start + self.delta + n), (3, n))


def placeholder_spans(token_ids: list[int], *placeholders: int) -> list[tuple[int, int]]:
    """Each run of placeholder ids, [start, end), in order."""
    at = np.flatnonzero(np.isin(np.asarray(token_ids), placeholders))
    if not at.size:
        return []
    breaks = np.flatnonzero(np.diff(at) > 1)
    starts = np.concatenate([[at[0]], at[breaks + 1]])
    ends = np.concatenate([at[breaks] + 1, [at[-1] + 1]])
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def media_spans(token_ids: list[int], audio: int, visual: tuple[int, ...]) -> tuple[list[tuple[int, int]],
                                                                                     list[tuple[int, int]]]:
    """The spans [start, end) of a prompt's clips and of its images and videos, in order. A video with its sound is
    one span in both: its frames' and sound's placeholders interleave."""
    ids = np.asarray(token_ids)
    clips, images = [], []
    for a, b in placeholder_spans(token_ids, audio, *visual):
        if (ids[a:b] == audio).any():
            clips.append((a, b))
        if np.isin(ids[a:b], visual).any():
            images.append((a, b))
    return clips, images
