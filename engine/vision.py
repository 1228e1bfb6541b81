"""Images and videos -> what the Thinker takes: pixel patches, the prompt's placeholders, M-RoPE's 3-D positions.

Pixels are resized as transformers' own Qwen2-VL image processor resizes them (the one Qwen3-Omni's processor
holds), so that the image's pixels lie within the profile's budget (`min_pixels`, `max_pixels`), and cross to
the engine so, as uint8; where the tower runs, `patches` scales, normalises and cuts them as that processor
does. Each placeholder stands for a 2x2 merge of 16x16 patches, 32x32 pixels. An image becomes
`<|vision_start|>`, one `<|image_pad|>` per merged patch, `<|vision_end|>`. A video is its frames two by two
(the tower's temporal patch), each frame resized alike: `<|video_pad|>` placeholders, one per merged patch of
each pair. A video with its sound (`use_audio_in_video`) becomes `<|vision_start|><|audio_start|>`, its
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

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.api import EngineError

try:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
except ImportError:  # transformers before the PIL backends
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_END = "<|vision_end|>"
# Qwen3-Omni's vision tower normalises pixels to [-1, 1] (Qwen3-VL's processor settings)
_MEAN_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image or video as it crosses to the engine: `pixels` uint8 [frames, height, width, 3], resized to a
    whole number of merged patches (an image is one frame; a video's frames fill its temporal patches), its patch
    grid (t, h, w); `key`: a digest of its pixels, negative so that no token id equals it (prefix reuse). The
    tower's input is `patches(...)` of it, made where the tower runs: uint8 is a quarter of the float32 patches'
    bytes, and an image's patches hold it twice over (the tower's temporal patch)."""

    pixels: torch.Tensor
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
    """[patches, 3 * temporal * patch * patch] float32 on `device` (the pixels' own by default): what
    transformers' Qwen2-VL image processor makes of the resized pixels. Scaled and normalised, cut into patches,
    each merge x merge block of patches in raster order, a patch's values (channel, frame, row, column); an image
    is repeated over the temporal patch."""
    t, h, w = image.grid_thw
    m = image.merge
    x = image.pixels.to(device).permute(0, 3, 1, 2).float() / 255  # [frames, 3, height, width]
    mean, std = _mean_std(normalisation, x.device)
    x = (x - mean) / std
    if x.shape[0] == 1:
        x = x.expand(temporal * t, -1, -1, -1)
    x = x.reshape(t, temporal, 3, h // m, m, patch, w // m, m, patch)
    return x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(t * h * w, 3 * temporal * patch * patch)


class ImagePreprocessor:
    """Pixels -> `ImageInput`: resized as transformers' Qwen2-VL image processor resizes (the one Qwen3-Omni's
    processor holds): its `smart_resize` to whole merged patches within the pixel budget, PIL's bicubic. The
    rest of that processor's work is `patches`, where the tower runs."""

    def __init__(self, vision_config: Any, *, min_pixels: int, max_pixels: int) -> None:
        self.merge = vision_config.spatial_merge_size
        self.patch = vision_config.patch_size
        self.temporal = vision_config.temporal_patch_size  # frames in one of the tower's patches
        self.min_pixels, self.max_pixels = min_pixels, max_pixels

    def _resized(self, pixels: np.ndarray) -> np.ndarray:
        try:
            height, width = smart_resize(pixels.shape[0], pixels.shape[1], factor=self.patch * self.merge,
                                         min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        except ValueError as e:  # e.g. an aspect ratio past 200:1
            raise EngineError(f"cannot use this image: {e}") from e
        return np.array(Image.fromarray(pixels).resize((width, height), Image.Resampling.BICUBIC))  # writable

    def __call__(self, pixels: np.ndarray, key: int) -> ImageInput:
        """`key`: the image's digest (negative, so that no token id equals it)."""
        if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
            raise EngineError(f"an image must be RGB uint8 [height, width, 3], got {pixels.dtype} {list(pixels.shape)}")
        if min(pixels.shape[:2]) < 2:
            raise EngineError(f"an image must be at least 2x2 pixels, got {pixels.shape[1]}x{pixels.shape[0]}")
        resized = self._resized(pixels)
        grid = (1, resized.shape[0] // self.patch, resized.shape[1] // self.patch)
        return ImageInput(torch.from_numpy(resized)[None], grid, key, self.merge)

    def video(self, frames: np.ndarray, fps: float, key: int, positions_per_second: int) -> ImageInput:
        """Frames [n, height, width, 3] uint8 sampled at `fps` -> each frame resized, `temporal` of them to each of
        the tower's temporal patches (the last frame repeated to fill the last one, as Qwen's processors pad)."""
        if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8 or not len(frames):
            raise EngineError(f"a video is RGB uint8 frames [n, height, width, 3], got {frames.dtype} "
                              f"{list(frames.shape)}")
        if min(frames.shape[1:3]) < 2:
            raise EngineError(f"a video's frames must be at least 2x2 pixels, got {frames.shape[2]}x{frames.shape[1]}")
        step = self.temporal / fps * positions_per_second
        if step != round(step):
            raise EngineError(f"a video's frame rate must give whole position steps, got {fps:g} frames a second")
        if pad := -len(frames) % self.temporal:
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        resized = np.stack([self._resized(frame) for frame in frames])
        grid = (len(frames) // self.temporal, resized.shape[1] // self.patch, resized.shape[2] // self.patch)
        return ImageInput(torch.from_numpy(resized), grid, key, self.merge, time_step=round(step), is_video=True)


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
