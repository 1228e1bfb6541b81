"""The windowed Code2Wav decode, the tests' reference for the streaming one: each chunk re-decodes left context.

Every call returns `samples_per_frame * T - tail_samples` samples for T frames:
the causal transposed convolutions drop their look-ahead tail. `ChunkWindow` says
which frames to decode for a chunk (with left context) and which samples of the
result belong to it, so that the chunks of a reply join into exactly the one-shot
decode of all its frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ChunkWindow:
    first_frame: int  # decode frames [first_frame, end_frame)
    end_frame: int
    emit_start: int  # reply-level sample range this chunk owns
    emit_end: int

    def slice_in_decode(self, samples_per_frame: int) -> slice:
        base = self.first_frame * samples_per_frame
        return slice(self.emit_start - base, self.emit_end - base)


class Code2WavRunner:
    def __init__(self, code2wav: torch.nn.Module) -> None:
        self.model = code2wav
        param = next(code2wav.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.num_quantizers = code2wav.config.num_quantizers
        self.samples_per_frame = int(code2wav.total_upsample)
        self.tail_samples = self._measure_tail()

    def _measure_tail(self) -> int:
        with torch.inference_mode():
            tails = {
                frames * self.samples_per_frame - self.decode(torch.zeros(1, self.num_quantizers, frames, dtype=torch.long)).shape[-1]
                for frames in (1, 3)
            }
        assert len(tails) == 1, f"Code2Wav's tail depends on length: {tails}"
        tail = tails.pop()
        assert 0 <= tail < self.samples_per_frame, tail
        return tail

    def window(self, start_frame: int, end_frame: int, left_context_frames: int) -> ChunkWindow:
        first = max(0, start_frame - left_context_frames)
        assert start_frame == 0 or first < start_frame, "chunks after the first need left context"
        emit_start = 0 if start_frame == 0 else start_frame * self.samples_per_frame - self.tail_samples
        return ChunkWindow(first, end_frame, emit_start, end_frame * self.samples_per_frame - self.tail_samples)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> float32 audio [B, samples_per_frame * T - tail]."""
        wav = self.model(codes.to(self.device))
        return wav[:, 0].float()

    def decode_windows(self, frames: list[torch.Tensor], windows: list[ChunkWindow]) -> list[torch.Tensor]:
        """Decode each request's window in one padded batch. frames[b]: [Q, T_b] codes of request b.

        Right padding cannot reach back into a row's emitted samples: every layer is causal
        except the look-ahead tail, which the window never emits.
        """
        lengths = [w.end_frame - w.first_frame for w in windows]
        batch = torch.zeros(len(windows), self.num_quantizers, max(lengths), dtype=torch.long)
        for b, (codes, w) in enumerate(zip(frames, windows, strict=True)):
            batch[b, :, : lengths[b]] = codes[:, w.first_frame : w.end_frame]
        wav = self.decode(batch).cpu()
        return [wav[b, w.slice_in_decode(self.samples_per_frame)] for b, w in enumerate(windows)]
