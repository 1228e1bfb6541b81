"""Talker stage: turns the Thinker's rows into codec frames, batching every request that is ready.

A request is prefilled once its prompt rows and first text token have arrived.
Each later step consumes one more text row (or tts_eos, then tts_pad once the
Thinker is done); a request whose next row has not arrived sits the step out.
When the Thinker paces its text (engine/stages/policy.py), each step tells it which replies
consumed a row.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.handoff import CodecFrames, Inbox, Report, SpeechProgress, ThinkerDone, ThinkerPrompt, ThinkerToken
from engine.metrics import EngineMetrics
from engine.profile import TalkerConfig
from engine.runners.sampler import RowSampling, new_seed, sample
from engine.runners.talker import TalkerRunner
from engine.stages.base import Stage

log = logging.getLogger(__name__)


def _to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """Start copying a GPU tensor to the host; returns the copy and a wait for it (a no-op on the CPU)."""
    if not tensor.is_cuda:
        return tensor, lambda: None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done.synchronize


@dataclass(slots=True)
class TalkerSeq:
    prompt: ThinkerPrompt
    sampling: RowSampling
    code_sampling: RowSampling
    text_rows: deque[torch.Tensor] = field(default_factory=deque)  # thinker embeds not yet consumed
    first_text: torch.Tensor | None = None
    thinker_done: bool = False
    eos_fed: bool = False
    slot: int = -1
    position: int = 0
    # set by the prefill, before the first decode step that reads them
    code0: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [] the next frame's codebook-0 id
    past_hidden: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [H]
    frames: int = 0
    last_frame_at: float = 0.0  # perf_counter() of its latest frame

    @property
    def request_id(self) -> str:
        return self.prompt.request_id


class TalkerStage(Stage):
    """Owns the pending (not yet prefilled) and running requests; the runner owns model and KV cache."""

    kind = "talker"

    def __init__(
        self,
        runner: TalkerRunner,
        cfg: TalkerConfig,
        inbox: Inbox,
        to_code2wav: Callable[[Any], None],
        to_thinker: Callable[[SpeechProgress], None] | None,  # when the Thinker paces its text
        report: Report,
        metrics: EngineMetrics,
        name: str | None = None,
    ) -> None:
        super().__init__(inbox, report, metrics, runner.device, name)
        self.runner = runner
        self.cfg = cfg
        self.to_code2wav = to_code2wav
        self.to_thinker = to_thinker
        self.pending: dict[str, TalkerSeq] = {}
        self.running: dict[str, TalkerSeq] = {}
        self._consumed: list[str] = []  # this step's, for the next SpeechProgress
        self._finished: list[str] = []

    def accept(self, item: Any) -> None:
        if isinstance(item, ThinkerPrompt):
            self.adopt(item.embeds), self.adopt(item.hidden)
            seed = new_seed(item.seed)
            s, c = self.cfg.sampling, self.cfg.code_sampling
            self.pending[item.request_id] = TalkerSeq(
                prompt=item,
                sampling=RowSampling(s.temperature, s.top_p, s.top_k, seed),
                # its own stream: the same seed and counters would repeat codebook 0's noise
                code_sampling=RowSampling(c.temperature, c.top_p, c.top_k, new_seed(seed + 1)),
            )
            return
        seq = self.pending.get(item.request_id) or self.running.get(item.request_id)
        if seq is None:  # aborted meanwhile
            return
        if isinstance(item, ThinkerToken):
            self.adopt(item.embed)
            if seq.first_text is None:
                seq.first_text = item.embed
            else:
                seq.text_rows.append(item.embed)
        elif isinstance(item, ThinkerDone):
            seq.thinker_done = True

    def release(self, request_id: str) -> None:
        self.pending.pop(request_id, None)
        seq = self.running.pop(request_id, None)
        if seq is not None:
            self.runner.kv.free(seq.slot)

    def _prefillable(self) -> list[TalkerSeq]:
        """Pending requests whose first text token is here, as many as there are free slots."""
        for seq in [s for s in self.pending.values() if s.first_text is None and s.thinker_done]:
            self._finish(seq)  # an empty reply has nothing to say
        ready = [s for s in self.pending.values() if s.first_text is not None]
        return ready[: min(self.runner.kv.num_free, self.cfg.max_prefill_batch)]

    def _ready(self) -> list[TalkerSeq]:
        return [s for s in self.running.values() if s.text_rows or s.thinker_done]

    def has_work(self) -> bool:
        return bool(self._ready()) or any(s.first_text is not None or s.thinker_done for s in self.pending.values())

    def num_waiting(self) -> int:
        return len(self.pending)

    def num_running(self) -> int:
        return len(self.running)

    def step(self) -> list[str]:
        self._consumed.clear()  # a failed step's are void
        self._finished.clear()
        seqs = self._prefillable()
        batch = self._prefill(seqs) if seqs else self._decode(self._ready())
        if self.to_thinker is not None and (self._consumed or self._finished):
            self.to_thinker(SpeechProgress(tuple(self._consumed), tuple(self._finished)))
        return batch

    def _prefill(self, seqs: list[TalkerSeq]) -> list[str]:
        prompts = []
        for seq in seqs:
            self.pending.pop(seq.request_id)
            seq.slot = self.runner.kv.allocate()
            self.running[seq.request_id] = seq
            p = seq.prompt
            assert seq.first_text is not None
            prompts.append(self.runner.prompt_embeds(p.token_ids, p.embeds, p.hidden, seq.first_text, p.speaker))
            seq.position = prompts[-1].shape[0]
            self._consumed.append(seq.request_id)  # its first text row is in the prompt
        self.last_batch, self.last_phase = [s.request_id for s in seqs], "prefill"
        self.runner.forget_codes([s.slot for s in seqs])
        logits, hidden = self.runner.prefill([s.slot for s in seqs], prompts)
        self._take_code0(seqs, logits, hidden)
        return self.last_batch

    def _decode(self, seqs: list[TalkerSeq]) -> list[str]:
        if not seqs:
            return []
        self.last_batch, self.last_phase = [s.request_id for s in seqs], "decode"
        code0 = torch.stack([s.code0 for s in seqs])
        past_hidden = torch.stack([s.past_hidden for s in seqs])
        codes, codec_sum = self.runner.residual_codes(past_hidden, code0, [s.code_sampling for s in seqs])
        inputs = codec_sum + self._next_text_rows(seqs)
        frames, copied = _to_host(codes)  # one copy for the batch, queued before the decode step
        # the decode step is queued before the host waits for the codes: the GPU goes straight on
        logits, hidden = self.runner.decode([s.slot for s in seqs], [s.position for s in seqs], inputs)
        copied()
        now = time.perf_counter()
        for seq, frame in zip(seqs, frames, strict=True):
            self.to_code2wav(CodecFrames(seq.request_id, frame[:, None], is_final=False))
            if seq.frames:
                self.metrics.reply_gap.labels(self.name).observe(now - seq.last_frame_at)
            seq.frames += 1
            seq.last_frame_at = now
        for seq in seqs:
            seq.position += 1
        done = [s for s in seqs if s.frames >= self.cfg.max_frames or s.position >= self.runner.kv.max_len]
        for seq in done:
            self._finish(seq)
        live = [i for i, s in enumerate(seqs) if s.request_id in self.running]
        if live:
            self._take_code0([seqs[i] for i in live], logits[live], hidden[live])
        return self.last_batch

    def _next_text_rows(self, seqs: list[TalkerSeq]) -> torch.Tensor:
        """Each request's next text-track row [B, H]: its next Thinker token, then tts_eos once, then tts_pad."""
        rows: list[torch.Tensor | None] = []
        fresh: list[tuple[int, torch.Tensor]] = []
        for i, seq in enumerate(seqs):
            if seq.text_rows:
                fresh.append((i, seq.text_rows.popleft()))
                rows.append(None)
                self._consumed.append(seq.request_id)
            elif not seq.eos_fed:
                seq.eos_fed = True
                rows.append(self.runner.tts_eos)
            else:
                rows.append(self.runner.tts_pad)
        if fresh:  # one projection for the batch, not one per request
            projected = self.runner.text_projection(torch.stack([row for _, row in fresh]))
            for (i, _), row in zip(fresh, projected, strict=True):
                rows[i] = row
        return torch.stack(rows)  # type: ignore[arg-type]

    def _take_code0(self, seqs: list[TalkerSeq], logits: torch.Tensor, hidden: torch.Tensor) -> None:
        slots = torch.tensor([s.slot for s in seqs]).to(logits.device, non_blocking=True)
        logits = self.runner.mask_logits(logits, allow_eos=not self.cfg.ignore_eos)
        if silent := [i for i, s in enumerate(seqs) if s.frames == 0]:
            # codec EOS before the first frame would end a reply with text and no speech at all
            logits[silent, self.runner.codec_eos_id] = float("-inf")
        logits = self.runner.penalise_repeats(logits, slots, self.cfg.sampling.repetition_penalty)
        tokens = sample(logits, [s.sampling for s in seqs])
        self.runner.remember_codes(slots, tokens)
        for seq, token_id, token, h in zip(seqs, tokens.tolist(), tokens, hidden, strict=True):
            if token_id == self.runner.codec_eos_id:
                self._finish(seq)
                continue
            seq.code0, seq.past_hidden = token, h

    def _finish(self, seq: TalkerSeq) -> None:
        self.release(seq.request_id)
        self._finished.append(seq.request_id)
        self.to_code2wav(CodecFrames(seq.request_id, torch.zeros(self.runner.num_code_groups, 0, dtype=torch.long), True))
