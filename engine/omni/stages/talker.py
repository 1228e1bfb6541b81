"""Talker stage: turns the Thinker's rows into codec frames, one packed step for every reply that is ready.

A step carries a row for every speaking reply whose next text row is here (its next Thinker token, tts_eos once,
then tts_pad) and, in the room `max_step_tokens` leaves, pieces of new replies' prompts: those that finish within
half the room first, then the others first come first served (policy.py says why).
A prompt's user turns are prefilled as the Thinker prefills them, its assistant part once the first text token is
here; its last piece samples the first codebook-0 id. A conversation's next turn takes the slot its last reply
left, with the user rows it holds (talker_prefix.py). A reply's first piece reserves the pages of its prompt and
its longest reply (`max_frames`)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.handoff import (
    CodecFrames,
    Inbox,
    PromptRows,
    Reached,
    Report,
    SpeechProgress,
    ThinkerDone,
    ThinkerPrompt,
    ThinkerToken,
)
from engine.metrics import EngineMetrics
from engine.omni.runners.sampler import RowSampling, new_seed, sample
from engine.omni.runners.talker import ASSISTANT_ROWS, PromptLayout, TalkerRow, TalkerRunner
from engine.omni.runners.talker_prefix import KeptRows, TalkerPrefixCache, user_row_ends
from engine.omni.stages.policy import finishing_share
from engine.positions import Rope
from engine.profile import TalkerConfig
from engine.stage import Stage

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
    position: int = 0  # rows in its slot
    layout: PromptLayout | None = None
    rope: Rope | None = None  # a prompt with images: the M-RoPE rows of its prompt and reply (engine/intake/images.py)
    row_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per user row (talker_prefix)
    held_until: int = 0  # Thinker positions before it: their user rows are in its slot already (a kept prefix)
    arrived: list[PromptRows] = field(default_factory=list)  # the Thinker's rows not yet turned into talker rows
    received: int = 0  # Thinker prompt rows turned into talker rows
    header: list[torch.Tensor] = field(default_factory=list)  # the Thinker's rows of the assistant header
    todo: torch.Tensor | None = None  # [n, H] talker prompt rows not yet prefilled
    header_queued: bool = False  # the assistant part is in `todo` or prefilled: the prompt's end is known
    # its next frame, set by the step that sampled the frame's codebook-0 id (the prefill's last piece, then each
    # decode step): all its codes [num_code_groups] and their summed embedding [H], the talker's next input
    next_codes: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    next_sum: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    frames: int = 0
    last_frame_at: float = 0.0  # perf_counter() of its latest frame

    @property
    def request_id(self) -> str:
        return self.prompt.request_id

    def next_rope(self, n: int) -> np.ndarray | None:
        """The M-RoPE rows of its next `n` rows, where they are not their positions."""
        return None if self.rope is None else self.rope.at(self.position, n)


class TalkerStage(Stage):
    """Owns the pending (not yet prefilled) and running requests; the runner owns model and KV cache."""

    kind = "talker"
    stream_priority = -1

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
        self.cache = TalkerPrefixCache(runner.kv, metrics.talker_prompt_rows, metrics.talker_kv_pages)
        self.pending: dict[str, TalkerSeq] = {}
        self.running: dict[str, TalkerSeq] = {}
        self._consumed: list[str] = []  # this step's, for the next SpeechProgress
        self._finished: list[str] = []

    def accept(self, item: Any) -> None:
        if isinstance(item, ThinkerPrompt):
            seed = new_seed(item.seed)
            s, c = self.cfg.sampling, self.cfg.code_sampling
            layout = self.runner.layout(item.token_ids)
            prompt = self.pending[item.request_id] = TalkerSeq(
                prompt=item,
                layout=layout,
                row_ends=user_row_ends(layout.user_spans),
                sampling=RowSampling(s.temperature, s.top_p, s.top_k, seed),
                # its own stream: the same seed and counters would repeat codebook 0's noise
                code_sampling=RowSampling(c.temperature, c.top_p, c.top_k, new_seed(seed + 1)),
            )
            if item.grids:
                prompt.rope = Rope.of(self.runner.positions(layout, item.token_ids, list(item.grids)))
            return
        seq = self.pending.get(item.request_id) or self.running.get(item.request_id)
        if seq is None:  # aborted meanwhile
            return
        if isinstance(item, PromptRows):
            self.adopt(item.embeds, item.written), self.adopt(item.hidden)
            seq.arrived.append(item)
        elif isinstance(item, ThinkerToken):
            self.adopt(item.embed)
            if seq.first_text is None:
                seq.first_text = item.embed
            else:
                seq.text_rows.append(item.embed)
        elif isinstance(item, ThinkerDone):
            seq.thinker_done = True

    def release(self, request_id: str) -> None:
        seq = self.pending.pop(request_id, None) or self.running.pop(request_id, None)
        if seq is not None and seq.slot >= 0:
            # its user rows stay for the conversation's next turn; a step that failed wrote none before `position`
            held = min(len(seq.row_ends), seq.position)
            self.cache.keep(KeptRows(seq.slot, seq.prompt.keys, seq.row_ends[:held]))

    def _ready(self) -> list[TalkerSeq]:
        return [s for s in self.running.values() if s.text_rows or s.thinker_done]

    def _prefillable(self) -> Iterator[TalkerSeq]:
        """Pending replies with rows to prefill now, first come first served; one without a slot only while fewer than
        `max_batch` hold one and its pages can be had, and none after one that waits for pages."""
        waiting = False
        holding = len(self.running) + sum(s.slot >= 0 for s in self.pending.values())
        for seq in self.pending.values():
            if not (seq.arrived or (seq.todo is not None and seq.todo.shape[0]) or self._header_ready(seq)):
                continue
            if seq.slot < 0:
                if waiting or holding >= self.cfg.max_batch:
                    continue
                if not (self.cache.num_free and self.cache.can_hold(self._room(seq))):
                    waiting = True
                    continue
                holding += 1  # the caller starts it
            yield seq

    def _room(self, seq: TalkerSeq) -> int:
        """A reply's prompt rows and a row per frame, reserved at its prefill so that it never waits for pages."""
        return min(len(seq.row_ends) + ASSISTANT_ROWS + self.cfg.max_frames, self.runner.kv.max_len)

    def _start(self, seq: TalkerSeq) -> None:
        """A reply's slot (its conversation's last, when that holds enough of its user rows) and its room's pages."""
        if (reuse := self.cache.claim(seq.prompt.keys, seq.row_ends)) is not None:
            seq.slot, seq.position = reuse.slot, reuse.rows
            seq.held_until = int(seq.row_ends[reuse.rows - 1])
        else:
            seq.slot = self.cache.allocate()
        self.runner.forget_codes([seq.slot])
        reserved = self.cache.reserve(seq.slot, self._room(seq))
        assert reserved, "_prefillable said its pages could be had"

    def _header_ready(self, seq: TalkerSeq) -> bool:
        """Its assistant part can be queued: the first text token and every prompt row are here."""
        return (not seq.header_queued and seq.first_text is not None
                and seq.received + sum(r.embeds.shape[0] for r in seq.arrived) == len(seq.prompt.token_ids))

    def has_work(self) -> bool:
        return (bool(self._ready()) or any(s.first_text is None and s.thinker_done for s in self.pending.values())
                or next(self._prefillable(), None) is not None)

    def num_waiting(self) -> int:
        return len(self.pending)

    def num_running(self) -> int:
        return len(self.running)

    def step(self) -> list[str]:
        self._consumed.clear()  # a failed step's are void
        self._finished.clear()
        for seq in [s for s in self.pending.values() if s.first_text is None and s.thinker_done]:
            self._finish(seq)  # an empty reply has nothing to say
        speaking = self._ready()
        pieces = self._take_pieces(self.cfg.max_step_tokens - len(speaking))
        if speaking or pieces:
            self._step(speaking, pieces)
        if self.to_thinker is not None and (self._consumed or self._finished):
            self.to_thinker(SpeechProgress(tuple(self._consumed), tuple(self._finished)))
        return self.last_batch

    def _take_pieces(self, room: int) -> list[tuple[TalkerSeq, torch.Tensor]]:
        """Pieces of the replies' prompts for one step. Each reply with rows here starts as soon as it can (a slot and
        its pages, in the order they came) and queues them; those whose whole prompt is queued and fits
        `finishing_share` of the room go whole, in that order, and the others share what is left first come first
        served: a turn whose first frame waits only on its own few rows does not wait behind another call's history."""
        queued = []
        for seq in self._prefillable():  # it checks each reply's pages as the ones before it take theirs
            if seq.slot < 0:
                self._start(seq)
            self._queue_rows(seq)
            if seq.todo is not None and seq.todo.shape[0]:
                queued.append(seq)  # else nothing of it to prefill yet (rows with no user turn, or no text yet)
        share = finishing_share(room)
        whole = []
        for seq in queued:
            assert seq.todo is not None
            if seq.header_queued and seq.todo.shape[0] <= share:
                whole.append(seq)
                share -= seq.todo.shape[0]
        pieces = []
        taken = {id(seq) for seq in whole}
        for seq in whole + [s for s in queued if id(s) not in taken]:
            if room <= 0:
                break
            assert seq.todo is not None
            rows, seq.todo = seq.todo[:room], seq.todo[room:]
            pieces.append((seq, rows))
            room -= rows.shape[0]
            self.metrics.talker_prompt_rows.labels("prefilled").inc(rows.shape[0])
        return pieces

    def _here(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows on this stage's device: of a kept prefix's host rows, only those its own slot lacks are copied."""
        return rows.to(self.device, non_blocking=True)

    def _queue_rows(self, seq: TalkerSeq) -> None:
        """The talker rows that can be prefilled now: those of the user turns among the Thinker rows that
        arrived, and the assistant part once the first text token and the whole prompt are here."""
        assert seq.layout is not None
        queued = [] if seq.todo is None else [seq.todo]
        header_at = seq.layout.header
        for rows in seq.arrived:
            held = max(0, min(seq.held_until - seq.received, rows.embeds.shape[0]))  # its slot has their user rows
            if held < rows.embeds.shape[0]:  # a long call's reused prefix comes in many pieces, nearly all held
                queued.append(self.runner.user_rows(seq.layout, self._here(rows.embeds[held:]),
                                                    self._here(rows.hidden[held:]), seq.received + held))
            end = seq.received + rows.embeds.shape[0]
            if end > header_at:
                seq.header.append(self._here(rows.embeds[max(0, header_at - seq.received) :]))
            seq.received = end
        seq.arrived.clear()
        if self._header_ready(seq):
            assert seq.first_text is not None
            queued.append(self.runner.assistant_rows(torch.cat(seq.header), seq.first_text, seq.prompt.speaker))
            seq.header_queued = True
        if queued:
            seq.todo = queued[0] if len(queued) == 1 else torch.cat(queued)

    def _step(self, speaking: list[TalkerSeq], pieces: list[tuple[TalkerSeq, torch.Tensor]]) -> None:
        self.last_batch = [s.request_id for s, _ in pieces] + [s.request_id for s in speaking]
        self.last_phase = "prefill" if pieces else "decode"
        rows = [TalkerRow(seq.slot, seq.position, embeds, seq.next_rope(embeds.shape[0])) for seq, embeds in pieces]
        frames, copied = torch.empty(0), lambda: None
        if speaking:
            codes = torch.stack([s.next_codes for s in speaking])
            inputs = torch.stack([s.next_sum for s in speaking]) + self._next_text_rows(speaking)
            rows += [TalkerRow(seq.slot, seq.position, inputs[i : i + 1], seq.next_rope(1)) for i, seq in enumerate(speaking)]
            frames, copied = _to_host(codes)  # one copy for the batch, queued before the step
        # the step is queued before the host waits for the codes: the GPU goes straight on
        logits, hidden = self.runner.step(rows)
        sampled: list[tuple[int, TalkerSeq]] = []  # (its row in the step, the reply whose next frame it gives)
        for i, (seq, embeds) in enumerate(pieces):
            seq.position += embeds.shape[0]
            if seq.header_queued and not seq.todo.shape[0]:  # type: ignore[union-attr]
                self.report(Reached(seq.request_id, "talker", time.perf_counter()))
                self.running[seq.request_id] = self.pending.pop(seq.request_id)
                self._consumed.append(seq.request_id)  # its first text row is in the prompt
                sampled.append((i, seq))
        copied()
        now = time.perf_counter()
        for i, (seq, frame) in enumerate(zip(speaking, frames, strict=False), start=len(pieces)):
            self.to_code2wav(CodecFrames(seq.request_id, frame[:, None], is_final=False))
            if seq.frames:
                self.metrics.reply_gap.labels(self.name).observe(now - seq.last_frame_at)
            seq.frames += 1
            seq.last_frame_at = now
            seq.position += 1
            if seq.frames >= self.cfg.max_frames or seq.position >= self.runner.kv.max_len:
                self._finish(seq)
            else:
                sampled.append((i, seq))
        if sampled:
            at = [i for i, _ in sampled]
            self._next_frames([seq for _, seq in sampled], logits[at], hidden[at])
        self.cache.count_pages()

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

    def _next_frames(self, seqs: list[TalkerSeq], logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Each reply's next frame from its row of this step: codebook 0 sampled from `logits`, the other codebooks
        predicted from it and `hidden`; a reply whose codebook 0 is codec EOS ends."""
        slots = torch.tensor([s.slot for s in seqs]).to(logits.device, non_blocking=True)
        logits = self.runner.mask_logits(logits, allow_eos=not self.cfg.ignore_eos)
        if silent := [i for i, s in enumerate(seqs) if s.frames == 0]:
            # codec EOS before the first frame would end a reply with text and no speech at all
            logits[silent, self.runner.codec_eos_id] = float("-inf")
        logits = self.runner.penalise_repeats(logits, slots, self.cfg.sampling.repetition_penalty)
        tokens = sample(logits, [s.sampling for s in seqs])
        self.runner.remember_codes(slots, tokens)
        ids, copied = _to_host(tokens)
        # the next frames' code predictor (15 passes) is queued before the host waits for the ids: the GPU runs it
        # while the host reads them, ends replies and prepares the next step; an ended reply's frame is dropped
        codes, total = self.runner.residual_codes(hidden, tokens, [s.code_sampling for s in seqs])
        copied()
        for seq, token_id, frame, frame_sum in zip(seqs, ids.tolist(), codes, total, strict=True):
            if token_id == self.runner.codec_eos_id:
                self._finish(seq)
                continue
            seq.next_codes, seq.next_sum = frame, frame_sum

    def _finish(self, seq: TalkerSeq) -> None:
        self.release(seq.request_id)
        self._finished.append(seq.request_id)
        self.to_code2wav(CodecFrames(seq.request_id, torch.zeros(self.runner.num_code_groups, 0, dtype=torch.long), True))
