"""The Thinker's audio tower over every clip of a prefill at once, its convolutions at a few fixed shapes.

The tower cuts each clip's log-mel into chunks of `2 * n_window` frames (one second) and runs three
convolutions over all chunks as one batch, then windowed attention per clip. Every new chunk count
is a new convolution shape, and the first time cuDNN meets a shape under load costs a request
~0.2 s. So on a GPU the batch is padded up to a bucket of chunks with a silent clip of its own
(its rows are dropped; attention windows never cross clips, so real rows are unchanged), and each
bucket is met once at start-up (`warm_up`). Counts past the largest bucket run as they are and are
counted as cold work (engine/cold_work.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from engine.cold_work import UNWARMED_SHAPE, ColdWork

# chunks of one second: x1.5 apart up to 768 s of audio in one prefill
CHUNK_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768)


class AudioEncoder:
    """`buckets`: chunk counts the batch is padded to (empty: unpadded, as on a CPU). `timed`: told the host
    time of each call (its launches, and the waits inside the tower for the lengths it reads back)."""

    def __init__(self, thinker: Any, n_window: int, num_mel_bins: int, *, buckets: tuple[int, ...] = (),
                 cold: ColdWork | None = None, timed: Callable[[float], None] | None = None) -> None:
        self.thinker = thinker
        param = next(thinker.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.chunk_frames = 2 * n_window
        self.num_mel_bins = num_mel_bins
        self.buckets = tuple(sorted(buckets))
        self.cold = cold
        self.timed = timed

    def __call__(self, clips: list[torch.Tensor], rows: int) -> torch.Tensor:
        """Log-mels [mel, frames] -> the tower's `rows` rows for them (their placeholders), in clip order [rows, H]."""
        started = time.perf_counter()
        chunks = sum(-(-clip.shape[-1] // self.chunk_frames) for clip in clips)
        bucket = min((b for b in self.buckets if b >= chunks), default=None)
        if bucket is None and self.buckets and self.cold is not None:
            self.cold.record(UNWARMED_SHAPE, f"audio tower over {chunks} chunks (largest warmed: {self.buckets[-1]})")
        if bucket is not None and bucket > chunks:
            clips = [*clips, torch.zeros(self.num_mel_bins, (bucket - chunks) * self.chunk_frames)]
        rows_out = self._encode(clips)[:rows]  # the padding clip's rows come last
        if self.timed is not None:
            self.timed(time.perf_counter() - started)
        return rows_out

    def _encode(self, clips: list[torch.Tensor]) -> torch.Tensor:
        frames = [clip.shape[-1] for clip in clips]
        batch = torch.zeros(len(clips), self.num_mel_bins, max(frames), dtype=self.dtype)
        mask = torch.zeros(len(clips), max(frames), dtype=torch.long)
        for i, clip in enumerate(clips):
            batch[i, :, : frames[i]] = clip
            mask[i, : frames[i]] = 1
        batch, mask = batch.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
        return self.thinker.get_audio_features(batch, feature_attention_mask=mask).last_hidden_state

    def warm_up(self) -> int:
        """Meet every bucket's shapes once (one clip each); returns how many."""
        for chunks in self.buckets:
            self._encode([torch.zeros(self.num_mel_bins, chunks * self.chunk_frames)])
        return len(self.buckets)
