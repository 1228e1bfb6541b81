"""Code2Wav stage: cuts each reply's codec frames into chunks and decodes ready chunks in one batch.

Async chunk on: a small first chunk (`initial_chunk_frames`) for an early first packet, then the `ramp_frames`
sizes, then `chunk_frames`; each reply's decoder state stays in a slot between its chunks. Chunk boundaries
depend only on frame counts, never on timing, so a reply's audio is the same however the stages interleave.
Async chunk off: one decode when the Talker finishes. Ready chunks go by playback deadline (first chunks first,
then the replies whose listeners hold least: playback.py), as many as fit `max_step_frames` a step, so none
holds the GPU for long."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.api import SAMPLE_RATE_HZ, AudioChunk
from engine.handoff import AudioFinished, CodecFrames, Inbox, Reached, Report
from engine.metrics import EngineMetrics
from engine.omni.runners.code2wav import StreamBatch, StreamingCode2Wav
from engine.profile import ChunkConfig, Code2WavConfig
from engine.stage import Stage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Code2WavSeq:
    request_id: str
    pieces: list[torch.Tensor] = field(default_factory=list)
    num_frames: int = 0
    decoded_frames: int = 0
    decoded_chunks: int = 0
    emitted_samples: int = 0
    is_final: bool = False
    slot: int | None = None  # decoder state slot, held from the first chunk to the last

    def frames(self) -> torch.Tensor:
        if len(self.pieces) > 1:
            self.pieces = [torch.cat(self.pieces, dim=1)]
        return self.pieces[0]


@dataclass(slots=True)
class _Reply:
    started: float  # perf_counter() when its playback began, moved on by each stall
    emitted_s: float  # audio emitted so far

    def held_s(self, now: float) -> float:
        return self.started + self.emitted_s - now


class PlaybackClock:
    """How much audio each speaking reply's listener holds, so that the least fed is fed first; owns each speaking
    reply's first-packet time and emitted audio. A listener plays a reply in real time from its first packet and
    stalls when it runs dry: what it holds at `now` is the audio emitted less what it played, the time since its
    first packet less the time it stalled. Shared by the Code2Wav copies' threads, so every access takes a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: dict[str, _Reply] = {}

    def emitted(self, request_id: str, audio_s: float, now: float | None = None) -> None:
        """`audio_s`: all the audio the reply has emitted so far."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            if (reply := self._replies.get(request_id)) is None:
                self._replies[request_id] = _Reply(now, audio_s)
                return
            # ran dry before this packet: the listener waited, and plays on from here
            reply.started = max(reply.started, now - reply.emitted_s)
            reply.emitted_s = audio_s

    def finished(self, request_id: str) -> None:
        """Its last packet was emitted, or it was aborted: nobody waits for more of it."""
        with self._lock:
            self._replies.pop(request_id, None)

    def buffered_s(self, request_id: str, now: float | None = None) -> float | None:
        """Audio its listener holds now; None before its first packet."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            reply = self._replies.get(request_id)
            return None if reply is None else reply.held_s(now)

    def least_buffered_s(self, now: float | None = None) -> float | None:
        """The least audio any speaking reply's listener holds now; None when no reply speaks."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            if not self._replies:
                return None
            return min(r.held_s(now) for r in self._replies.values())


class Code2WavStage(Stage):
    """Owns each reply's frame buffer, chunk position and state slot; the decoder owns the model."""

    kind = "code2wav"
    stream_priority = -2

    def __init__(
        self,
        decoder: StreamingCode2Wav,
        cfg: Code2WavConfig,
        chunks: ChunkConfig,
        clock: PlaybackClock,
        inbox: Inbox,
        report: Report,
        metrics: EngineMetrics,
        name: str | None = None,
    ) -> None:
        super().__init__(inbox, report, metrics, decoder.device, name)
        self.decoder = decoder
        self.cfg = cfg
        self.chunks = chunks
        self.clock = clock
        self.seqs: dict[str, Code2WavSeq] = {}
        self.free_slots = list(range(decoder.num_slots))[::-1]

    def accept(self, item: CodecFrames) -> None:
        seq = self.seqs.setdefault(item.request_id, Code2WavSeq(item.request_id))
        if item.frames.shape[1]:
            seq.pieces.append(item.frames)
            seq.num_frames += item.frames.shape[1]
        seq.is_final = seq.is_final or item.is_final

    def release(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        self.clock.finished(request_id)
        if seq is not None and seq.slot is not None:
            self.free_slots.append(seq.slot)

    def _next_end(self, seq: Code2WavSeq) -> int | None:
        """End frame of the next chunk to decode, or None when it is not ready yet."""
        pending = seq.num_frames - seq.decoded_frames
        if not self.chunks.enabled:
            return seq.num_frames if seq.is_final else None
        size = self.chunks.size(seq.decoded_chunks)
        if pending >= size:
            return seq.decoded_frames + size
        return seq.num_frames if seq.is_final else None

    def has_work(self) -> bool:
        return any(self._next_end(s) is not None and self._can_start(s) for s in self.seqs.values())

    def _can_start(self, seq: Code2WavSeq) -> bool:
        return seq.slot is not None or bool(self.free_slots)

    def num_waiting(self) -> int:
        return sum(self._next_end(s) is None for s in self.seqs.values())

    def num_running(self) -> int:
        return len(self.seqs)

    def step(self) -> list[str]:
        ready = [(s, end) for s in self.seqs.values() if (end := self._next_end(s)) is not None]
        ready.sort(key=lambda item: self._deadline(item[0]))
        ready = self._capped(ready)
        for seq, _ in ready:  # a new reply starts only when a slot is free
            if seq.slot is None and self.free_slots:
                seq.slot = self.free_slots.pop()
        ready = [(s, end) for s, end in ready if s.slot is not None]
        self.last_batch = [s.request_id for s, _ in ready]
        # final with every frame decoded already: only the end of the stream is left to send
        closing = [s for s, end in ready if end == s.decoded_frames]
        to_decode = [(s, end) for s, end in ready if end > s.decoded_frames]
        now = time.perf_counter()
        for seq, _ in to_decode:
            if not seq.decoded_chunks:
                self.report(Reached(seq.request_id, "code2wav", now))
        if to_decode:
            audio = self._decode(to_decode)
            for (seq, end), samples in zip(to_decode, audio, strict=True):
                seq.decoded_frames = end
                seq.decoded_chunks += 1
                self._emit(seq, seq.emitted_samples, samples.numpy())
        for seq in closing:
            end_sample = seq.num_frames * self.decoder.samples_per_frame - self.decoder.tail_samples
            self._emit(seq, max(0, end_sample), np.zeros(0, dtype=np.float32))
        if self.last_batch and (least := self.clock.least_buffered_s()) is not None:
            self.metrics.playback_slack.observe(least)
        return self.last_batch

    def _capped(self, ready: list[tuple[Code2WavSeq, int]]) -> list[tuple[Code2WavSeq, int]]:
        """The most urgent chunks that fit a step: `max_batch`, padded to the widest within `max_step_frames`."""
        taken: list[tuple[Code2WavSeq, int]] = []
        widest = 0
        for seq, end in ready[: self.cfg.max_batch]:
            wide = max(widest, end - seq.decoded_frames)
            if taken and (len(taken) + 1) * wide > self.cfg.max_step_frames:
                break
            taken.append((seq, end))
            widest = wide
        return taken

    def _deadline(self, seq: Code2WavSeq) -> tuple[bool, float]:
        """First chunks first, then the least audio held (a reply with no first packet yet holds none)."""
        if seq.emitted_samples == 0:
            return (False, 0.0)
        return (True, self.clock.buffered_s(seq.request_id) or 0.0)

    def _decode(self, to_decode: list[tuple[Code2WavSeq, int]]) -> list[torch.Tensor]:
        sizes = [end - s.decoded_frames for s, end in to_decode]
        codes = torch.zeros(len(to_decode), self.decoder.num_quantizers, max(sizes), dtype=torch.long)
        for b, ((seq, end), n) in enumerate(zip(to_decode, sizes, strict=True)):
            codes[b, :, :n] = seq.frames()[:, seq.decoded_frames : end]
        batch = StreamBatch(
            codes,
            slots=torch.tensor([s.slot for s, _ in to_decode]),
            new_frames=torch.tensor(sizes),
            past_frames=torch.tensor([s.decoded_frames for s, _ in to_decode]),
        )
        wav, valid = self.decoder.decode(batch)
        host, lengths = wav.cpu(), valid.tolist()
        return [host[b, : lengths[b]] for b in range(len(to_decode))]

    def _emit(self, seq: Code2WavSeq, sample_offset: int, samples: np.ndarray) -> None:
        seq.emitted_samples = sample_offset + len(samples)
        is_last = seq.is_final and seq.decoded_frames == seq.num_frames
        self.clock.emitted(seq.request_id, seq.emitted_samples / SAMPLE_RATE_HZ)
        self.report(AudioChunk(seq.request_id, samples, sample_offset, is_last))
        if is_last:
            self.release(seq.request_id)
            self.report(AudioFinished(seq.request_id, seq.num_frames))
