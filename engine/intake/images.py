"""Images and videos -> what crosses to the engine: pixels resized within the profile's budget, the prompt's
placeholders, their grids.

Pixels are resized as transformers' Qwen2-VL image processor resizes them, within the profile's budget
(`min_pixels`, `max_pixels`), and cross as uint8 (`ImageInput`); the tower cuts them into patches where it runs.
Each placeholder stands for a 2x2 merge of 16x16 patches. An image becomes `<|vision_start|>`, one `<|image_pad|>`
per merged patch, `<|vision_end|>`; a video, its frames two by two (the temporal patch) as `<|video_pad|>`s. A
video with its sound (`use_audio_in_video`) becomes `<|vision_start|><|audio_start|>`, its video and audio
placeholders interleaved by time, `<|audio_end|><|vision_end|>`, as Qwen3-Omni's processor lays it out."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.api import EngineError
from engine.handoff import ImageInput

try:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
except ImportError:  # transformers before the PIL backends
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_END = "<|vision_end|>"


class ImagePreprocessor:
    """Pixels -> `ImageInput`: the Qwen2-VL processor's `smart_resize` to whole merged patches within the pixel budget,
    PIL's bicubic; the rest of that processor's work is `patches`, where the tower runs."""

    def __init__(self, vision_config: Any, *, min_pixels: int, max_pixels: int) -> None:
        self.merge = vision_config.spatial_merge_size
        self.patch = vision_config.patch_size
        self.temporal = vision_config.temporal_patch_size  # frames in one of the tower's patches
        self.min_pixels, self.max_pixels = min_pixels, max_pixels

    def size(self, height: int, width: int) -> tuple[int, int]:
        """The height and width a picture of this size is resized to."""
        try:
            return smart_resize(height, width, factor=self.patch * self.merge, min_pixels=self.min_pixels,
                                max_pixels=self.max_pixels)
        except ValueError as e:  # e.g. an aspect ratio past 200:1
            raise EngineError(f"cannot use this image: {e}") from e

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """The tower's patch grid for a picture of this size."""
        height, width = self.size(height, width)
        return 1, height // self.patch, width // self.patch

    def _resized(self, pixels: np.ndarray) -> np.ndarray:
        height, width = self.size(pixels.shape[0], pixels.shape[1])
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
