"""The Thinker's audio tower over every clip of a prefill at once, at a few fixed shapes, replayed from CUDA
graphs on a GPU.

The tower cuts each clip's log-mel into one-second chunks of `2 * n_window` frames, runs three convolutions over
all chunks as one batch, then windowed attention within each clip (audio_tower.py lays that out at one shape per
chunk count). On a GPU the chunks are padded up to a bucket (`CHUNK_BUCKETS`), each met once at start-up
(`warm_up`), since cuDNN's first meeting of a convolution shape is slow. Up to `DENSE_CHUNKS` the padded layout
runs, captured as CUDA graphs on a GPU; more audio in one prefill goes through transformers' forward, with a
silent clip of its own as the padding. Counts past the largest bucket run as they are, counted as cold work."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from engine.metrics import UNWARMED_SHAPE, ColdWork
from engine.omni.runners.audio_tower import PaddedTower
from engine.omni.runners.replay import capture

# chunks of one second: x1.5 apart up to 768 s of audio in one prefill
CHUNK_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768)
# the padded layout's attention is one masked call over all its tokens: small up to 64 s (832 tokens)
DENSE_CHUNKS = 64


class _Graph:
    def __init__(self, tower: PaddedTower, chunks: int, device: torch.device, pool: Any,
                 stream: torch.cuda.Stream) -> None:
        self.features, self.windows = tower.silence(chunks, device)
        self.graph, self.out = capture(lambda: tower.forward(self.features, self.windows), pool, stream)


class AudioEncoder:
    """`buckets`: chunk counts the batch is padded to (none on a CPU); `graphed`: capture those up to DENSE_CHUNKS."""

    def __init__(self, thinker: Any, *, buckets: tuple[int, ...] = (), graphed: bool = False,
                 cold: ColdWork | None = None, timed: Callable[[float], None] | None = None) -> None:
        self.thinker = thinker
        tower = getattr(thinker, "audio_tower", None) or thinker.model.audio_tower
        self.tower = PaddedTower(tower)
        param = next(tower.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.chunk_frames = self.tower.chunk_frames
        self.num_mel_bins = tower.config.num_mel_bins
        self.buckets = tuple(sorted(buckets))
        self.graphed = graphed
        self.graphs: dict[int, _Graph] = {}
        self.cold = cold
        self.timed = timed

    def chunks(self, clip: torch.Tensor) -> int:
        return -(-clip.shape[-1] // self.chunk_frames)

    def __call__(self, clips: list[torch.Tensor], rows: int) -> torch.Tensor:
        """Log-mels [mel, frames] -> the tower's rows for them (their `rows` placeholders), in clip order [rows, H]."""
        started = time.perf_counter()
        chunks = sum(self.chunks(clip) for clip in clips)
        bucket = min((b for b in self.buckets if b >= chunks), default=None)
        if bucket is None and self.buckets and self.cold is not None:
            self.cold.record(UNWARMED_SHAPE, f"audio tower over {chunks} chunks (largest warmed: {self.buckets[-1]})")
        size = bucket or chunks
        if size <= DENSE_CHUNKS:
            rows_out = self._padded(clips, size)
        else:
            if size > chunks:
                clips = [*clips, torch.zeros(self.num_mel_bins, (size - chunks) * self.chunk_frames)]
            rows_out = self._encode(clips)[:rows]  # the padding clip's rows come last
        assert rows_out.shape[0] == rows, (rows_out.shape, rows)
        if self.timed is not None:
            self.timed(time.perf_counter() - started)
        return rows_out

    def _padded(self, clips: list[torch.Tensor], chunks: int) -> torch.Tensor:
        layout = self.tower.layout(clips, chunks)
        if (graph := self.graphs.get(chunks)) is not None:
            graph.features.copy_(layout.features, non_blocking=True)
            graph.windows.copy_(layout.windows, non_blocking=True)
            graph.graph.replay()
            out = graph.out
        else:
            out = self.tower.forward(layout.features.to(self.device, non_blocking=True),
                                     layout.windows.to(self.device, non_blocking=True))
        return out[layout.real.to(self.device, non_blocking=True)]

    def _encode(self, clips: list[torch.Tensor]) -> torch.Tensor:
        """transformers' own forward (attention one call per window)."""
        frames = [clip.shape[-1] for clip in clips]
        batch = torch.zeros(len(clips), self.num_mel_bins, max(frames), dtype=self.dtype)
        mask = torch.zeros(len(clips), max(frames), dtype=torch.long)
        for i, clip in enumerate(clips):
            batch[i, :, : frames[i]] = clip
            mask[i, : frames[i]] = 1
        batch, mask = batch.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
        return self.thinker.get_audio_features(batch, feature_attention_mask=mask).last_hidden_state

    def warm_up(self) -> int:
        """Meet every bucket's shapes once, and capture the padded ones when graphed; returns how many buckets."""
        for chunks in self.buckets:
            if chunks <= DENSE_CHUNKS:
                self.tower.forward(*self.tower.silence(chunks, self.device))
            else:
                self._encode([torch.zeros(self.num_mel_bins, chunks * self.chunk_frames)])
        if self.graphed:
            pool, stream = None, torch.cuda.Stream(self.device)
            for chunks in sorted((b for b in self.buckets if b <= DENSE_CHUNKS), reverse=True):
                self.graphs[chunks] = _Graph(self.tower, chunks, self.device, pool, stream)
                pool = self.graphs[chunks].graph.pool()
        return len(self.buckets)
