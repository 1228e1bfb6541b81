"""Thinker stage: schedules one packed step at a time, streams text, feeds the Talker row by row.

A step carries a row for every running reply and the prompt pieces that fit `max_step_tokens`: prompts that finish
within half the room first, then the others first come first served (policy.py says why, and why the budget is
fixed). Whether a step runs for the running replies alone is the first-packet policy's call: with text pacing the
Thinker waits while every reply's text is far enough ahead of its speech, which the Talker reports as it consumes
rows (`SpeechProgress`)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from engine.api import TextDelta
from engine.handoff import (
    AdmittedRequest,
    Inbox,
    PromptRows,
    Reached,
    Report,
    SpeechProgress,
    ThinkerDone,
    ThinkerFinished,
    ThinkerPrompt,
    ThinkerToken,
)
from engine.metrics import EngineMetrics
from engine.omni.runners.audio_encoder import DENSE_CHUNKS
from engine.omni.runners.prefix_cache import Entry, PrefixCache, host_rows, position_keys
from engine.omni.runners.sampler import Grammars, RowSampling, new_seed, sample
from engine.omni.runners.thinker import RowOut, StepRow, StepRunner
from engine.omni.stages.policy import FirstPacketPolicy, finishing_share
from engine.omni.stages.thinker_seq import ThinkerBatch, ThinkerSeq
from engine.positions import Rope, media_spans
from engine.profile import ThinkerConfig
from engine.stage import Stage

log = logging.getLogger(__name__)


class ThinkerStage(Stage):
    """Owns the waiting queue, the prompts being prefilled, the running sequences and the prefix cache."""

    kind = "thinker"

    def __init__(
        self,
        runner: StepRunner,
        cfg: ThinkerConfig,
        tokenizer: Any,
        eos_ids: set[int],
        policy: FirstPacketPolicy,
        inbox: Inbox,
        to_talker: Callable[[Any], None],
        report: Report,
        metrics: EngineMetrics,
    ) -> None:
        super().__init__(inbox, report, metrics, runner.device)
        self.runner = runner
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.eos_ids = set() if cfg.ignore_eos else eos_ids
        self.policy = policy
        self.to_talker = to_talker
        self.cache = PrefixCache(runner.kv, metrics.prefix, host_bytes=int(cfg.kept_prefix_host_gib * 2**30))
        self.waiting: deque[ThinkerSeq] = deque()
        self.partial: list[ThinkerSeq] = []  # holding a slot, prompt not yet all prefilled
        self.running: dict[str, ThinkerSeq] = {}
        self.grammars = Grammars(tokenizer)

    def accept(self, item: AdmittedRequest | SpeechProgress) -> None:
        if isinstance(item, SpeechProgress):
            for request_id in item.consumed:
                if (seq := self.running.get(request_id)) is not None:
                    seq.spoken += 1
            for request_id in item.finished:
                if (seq := self.running.get(request_id)) is not None:
                    seq.talker_done = True  # e.g. speech hit its frame cap: the text must still finish
            return
        sampling = RowSampling(item.temperature, item.top_p, item.top_k, new_seed(item.seed))
        clips, images = (media_spans(item.token_ids, self.runner.audio_token_id,
                                     self.runner.visual_token_ids if item.images else ())
                         if item.audio_features or item.images else ([], []))
        keys = position_keys(item.token_ids, clips + images, item.audio_keys + [i.key for i in item.images])
        grammar = None if item.grammar is None else self.grammars.start(item.grammar)
        rope = None if item.positions is None else Rope.of(item.positions)
        self.waiting.append(ThinkerSeq(job=item, sampling=sampling, keys=keys, clips=clips, images=images, rope=rope,
                                       grammar=grammar))

    def release(self, request_id: str) -> None:
        self.waiting = deque(s for s in self.waiting if s.job.request_id != request_id)
        for piecewise in [s for s in self.partial if s.job.request_id == request_id]:
            self.partial.remove(piecewise)
            self._keep_prefilled(piecewise)
        if (seq := self.running.pop(request_id, None)) is not None:
            self._keep(seq)

    def _keep(self, seq: ThinkerSeq) -> None:
        """A finished (or aborted) request's slot stays filled for a prompt that begins the same."""
        kept = np.concatenate([seq.keys, np.asarray(seq.generated[: seq.position - seq.prompt_len], dtype=np.int64)])
        self.cache.keep(Entry(seq.slot, kept, seq.prompt_len, host_rows(seq.embeds), host_rows(seq.hidden)))

    def _keep_prefilled(self, seq: ThinkerSeq) -> None:
        """A prompt ended before its reply began (a turn cancelled while it waited for its pieces): what its slot
        holds, the cached prefix it took when it started and the pieces since, stays for the conversation's next
        turn. Prompts start as soon as they can, so without this a cancelled turn would lose its call's history."""
        if seq.position < self.cache.min_tokens:
            self.runner.kv.free(seq.slot)
            return
        self.cache.keep(Entry(seq.slot, seq.keys[: seq.position], seq.position, host_rows(seq.embeds),
                              host_rows(seq.hidden)))

    def has_work(self) -> bool:
        return self._wants_decode() or bool(self.partial) or self._may_start()

    def _may_start(self) -> bool:
        """A slot, and the pages of the next waiting prompt and its longest reply, can be had."""
        return (bool(self.waiting) and len(self.running) + len(self.partial) < self.cfg.max_batch
                and self.cache.num_free > 0 and self.cache.can_hold(self._room(self.waiting[0])))

    def _room(self, seq: ThinkerSeq) -> int:
        """A request's prompt and longest reply, reserved when it starts so that a reply never waits for pages."""
        return min(seq.prompt_len + seq.job.max_tokens + 1, self.runner.kv.max_len)

    def _wants_decode(self) -> bool:
        return self.policy.thinker_may_decode(self.running.values())

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.partial)

    def num_running(self) -> int:
        return len(self.running)

    def step(self) -> list[str]:
        batch = self._schedule()
        if batch is None:
            return []
        outs = self._forward(batch)
        self._postprocess(batch, outs)
        return self.last_batch

    def _schedule(self) -> ThinkerBatch | None:
        replies = list(self.running.values())
        # the profile keeps room for pieces beside a row per running reply (`max_batch` + 64 at least)
        pieces = self._take_pieces(self.cfg.max_step_tokens - len(replies))
        if not pieces and not self._wants_decode():
            return None
        rows = [self._piece_row(seq, end) for seq, end in pieces] + [self._reply_row(seq) for seq in replies]
        return ThinkerBatch(pieces, replies, rows)

    def _forward(self, batch: ThinkerBatch) -> list[RowOut]:
        self.last_phase = "prefill" if batch.pieces else "decode"
        self.last_batch = batch.request_ids
        try:
            return self.runner.step(batch.rows)
        except Exception as e:
            if not batch.pieces or not batch.replies:
                raise
            return self._forward_without_pieces(batch, e)

    def _forward_without_pieces(self, batch: ThinkerBatch, error: Exception) -> list[RowOut]:
        """A prompt's piece can fail a step that the replies beside it did nothing to (memory for a long clip): the
        pieces' requests fail alone, and the speaking replies take their step without them."""
        log.exception("thinker step with prompt pieces failed; its %d replies step again without them",
                      len(batch.replies))
        self.fail([seq.job.request_id for seq, _ in batch.pieces], error)
        batch.rows, batch.pieces = batch.rows[len(batch.pieces) :], []
        self.last_phase, self.last_batch = "decode", batch.request_ids
        return self.runner.step(batch.rows)

    def _postprocess(self, batch: ThinkerBatch, outs: list[RowOut]) -> None:
        """Pieces' rows to the Talker, the next token of every reply and of every prompt this step finished."""
        finishing = self._hand_on(batch.pieces, outs)
        sampled = finishing + list(zip(batch.replies, outs[len(batch.pieces) :], strict=True))
        if sampled:
            tokens, embeds = self._sample(torch.stack([o.logits for _, o in sampled]), [s for s, _ in sampled])
            now = time.perf_counter()
            for i, ((seq, _), token, embed) in enumerate(zip(sampled, tokens, embeds, strict=True)):
                if i < len(finishing):
                    self._begin_reply(seq)
                else:
                    seq.position += 1
                    if seq.job.want_audio:
                        self.metrics.reply_gap.labels(self.name).observe(now - seq.last_token_at)
                seq.last_token_at = now
                self._advance(seq, token, embed)
        self.cache.count_pages()
        tokens_in_step = sum(len(r.token_ids) for r in batch.rows)
        self.metrics.step_tokens.labels("prompt").observe(tokens_in_step - len(batch.replies))
        self.metrics.step_tokens.labels("decode").observe(len(batch.replies))

    def _hand_on(self, pieces: list[tuple[ThinkerSeq, int]], outs: list[RowOut]) -> list[tuple[ThinkerSeq, RowOut]]:
        """Each piece's rows to its Talker; the prompts whose last piece this was, with their outputs."""
        finishing = []
        # the step is queued, not done: the Talker's stream waits for it before reading the rows
        written = self.written() if pieces else None
        for (seq, end), out in zip(pieces, outs, strict=False):
            seq.position = end
            if seq.job.want_audio:
                seq.embeds.append(out.embeds)
                seq.hidden.append(out.hidden)
                self.to_talker(PromptRows(seq.job.request_id, out.embeds, out.hidden, written))
            if end == seq.prompt_len:
                finishing.append((seq, out))
        return finishing

    def _piece_end(self, seq: ThinkerSeq, room: int, audio_room: int, first: bool) -> tuple[int, int]:
        """Where the next piece of `seq` ends with `room` tokens and `audio_room` chunks of audio left in the step, and
        the chunks its clips take: never inside a clip, nor past one that would take the step's audio beyond the
        tower's dense, graphed layout. A clip that starts the step's first piece goes whole, whatever the room (a
        prompt always progresses); a later piece stops before it. Images go whole too."""
        end, taken = min(seq.prompt_len, seq.position + room), 0
        for a, b in seq.images:
            if seq.position <= a < end < b:
                end = a if a > seq.position else (b if first else seq.position)
                break
        for (a, b), features in zip(seq.clips, seq.job.audio_features, strict=True):
            if a < seq.position:
                continue
            if a >= end:
                break
            chunks = self.runner.audio_chunks(features)
            if b > end or taken + chunks > audio_room:
                end = a if a > seq.position else (b if first else seq.position)
                return end, taken + chunks if end == b else taken
            taken += chunks
        return end, taken

    def _take_pieces(self, room: int) -> list[tuple[ThinkerSeq, int]]:
        """Prompt pieces for one step. Waiting prompts start (a slot, their cached prefix, their pages) as soon as
        they can, in the order they came, so that what is left of each is known. Then the prompts whose rest fits
        `finishing_share` of the room go whole, in that order; the others take what is left first come first served,
        nothing going behind one that this step does not finish. A prompt that finishes begins its reply in this
        step; one cut before a clip that no longer fits the step goes on in the next."""
        while self._may_start():
            self.partial.append(self._start(self.waiting.popleft()))
        pieces: list[tuple[ThinkerSeq, int]] = []
        audio_room, share = DENSE_CHUNKS, finishing_share(room)
        for seq in self.partial:
            if seq.prompt_len - seq.position > share:
                continue  # its clips need not be walked: it cannot finish here
            end, chunks = self._piece_end(seq, share, audio_room, first=False)
            if end == seq.prompt_len:
                pieces.append((seq, end))
                share -= end - seq.position
                room -= end - seq.position
                audio_room -= chunks
        finishing = {id(seq) for seq, _ in pieces}
        for seq in self.partial:
            if room <= 0:
                break
            if id(seq) in finishing:
                continue
            end, chunks = self._piece_end(seq, room, audio_room, first=not pieces)
            if end == seq.position:
                break  # its next clip does not fit what is left of this step
            pieces.append((seq, end))
            room -= end - seq.position
            audio_room -= chunks
            if end < seq.prompt_len:
                break
        return pieces

    def _piece_row(self, seq: ThinkerSeq, end: int) -> StepRow:
        clips = tuple(f for (a, _), f in zip(seq.clips, seq.job.audio_features, strict=True) if seq.position <= a < end)
        images = tuple(i for (a, _), i in zip(seq.images, seq.job.images, strict=True) if seq.position <= a < end)
        rope = None if seq.rope is None else seq.rope.at(seq.position, end - seq.position)
        return StepRow(seq.slot, seq.job.token_ids[seq.position : end], seq.position, clips, images, rope)

    def _reply_row(self, seq: ThinkerSeq) -> StepRow:
        rope = None if seq.rope is None else seq.rope.at(seq.position, 1)
        return StepRow(seq.slot, [seq.generated[-1]], seq.position, rope=rope)

    def _start(self, seq: ThinkerSeq) -> ThinkerSeq:
        job = seq.job
        if job.want_audio:  # its Talker prefills the prompt's rows as they come
            self.report(Reached(job.request_id, "thinker", time.perf_counter()))
            self.to_talker(ThinkerPrompt(job.request_id, job.token_ids, job.speaker, job.seed, seq.keys,
                                         tuple(i.grid for i in job.images)))
        reuse = self.cache.claim(seq.keys, seq.clips + seq.images, want_hidden=job.want_audio)
        seq.slot = self.cache.allocate() if reuse is None else reuse.slot
        reserved = self.cache.reserve(seq.slot, self._room(seq))
        assert reserved, "_may_start said its pages could be had"
        if reuse is None:
            return seq
        seq.position, seq.cached = reuse.length, reuse.length
        if job.want_audio:
            assert reuse.embeds is not None and reuse.hidden is not None
            seq.embeds, seq.hidden = list(reuse.embeds), list(reuse.hidden)
            # where the entry keeps them (the host, on a GPU): the Talker copies over what its own slot lacks; the
            # event covers this stream's copies into them that may still be queued
            written = self.written()
            for embeds, hidden in zip(reuse.embeds, reuse.hidden, strict=True):
                self.to_talker(PromptRows(job.request_id, embeds, hidden, written))
            held = sum(piece.shape[0] for piece in reuse.embeds)
            if reuse.length > held:
                # the cached reply's rows: text, which the Talker reads only from user turns
                embeds = self.runner.embed(job.token_ids[held : reuse.length])
                seq.embeds.append(embeds)
                seq.hidden.append(embeds.new_zeros(embeds.shape))
                self.to_talker(PromptRows(job.request_id, embeds, seq.hidden[-1], self.written()))
        return seq

    def _begin_reply(self, seq: ThinkerSeq) -> None:
        """Its prompt is all in the cache (and its Talker has every row): it runs from now on."""
        self.partial.remove(seq)
        self.running[seq.job.request_id] = seq

    def _sample(self, logits: torch.Tensor, seqs: list[ThinkerSeq]) -> tuple[list[int], list[torch.Tensor | None]]:
        """The batch's next tokens and, for the Talker, their embeddings: one lookup for the batch,
        queued before the host reads the tokens, so the embeddings are done when they are sent."""
        allowed = self.grammars.mask([s.grammar for s in seqs])  # None when no reply is constrained
        ids = sample(logits, [s.sampling for s in seqs], allowed)
        embeds = self.runner.embed(ids) if any(s.job.want_audio for s in seqs) else [None] * len(seqs)
        return ids.tolist(), list(embeds)

    def _advance(self, seq: ThinkerSeq, token: int, embed: torch.Tensor | None) -> None:
        job = seq.job
        is_eos = token in self.eos_ids
        if seq.grammar is not None:
            seq.grammar.accept(token)
        if not is_eos:
            seq.generated.append(token)
            self._emit_text(seq)
            if job.want_audio:
                if len(seq.generated) == 1:
                    self.report(Reached(job.request_id, "first_token", time.perf_counter()))
                self._speak(seq, token, embed)
        # a finished grammar ends the reply, at its last token or (with ignore_eos too) at EOS
        is_eos = is_eos or (seq.grammar is not None and seq.grammar.done)
        at_limit = len(seq.generated) >= job.max_tokens or seq.position + 1 >= self.runner.kv.max_len
        if is_eos or at_limit:
            self._emit_text(seq, final=True)
            self.release(job.request_id)
            if job.want_audio:
                self.to_talker(ThinkerDone(job.request_id))
            self.report(
                ThinkerFinished(job.request_id, "stop" if is_eos else "length", len(job.token_ids), len(seq.generated),
                                seq.cached)
            )

    def _speak(self, seq: ThinkerSeq, token: int, embed: torch.Tensor | None) -> None:
        """Send a token's row to the Talker, unless it is part of a tool call."""
        tags = seq.job.tool_call_ids
        if tags is not None and token == tags[0]:
            seq.in_tool_call = True
        elif seq.after_tool_call and not self.tokenizer.decode([token]).isspace():
            seq.after_tool_call = False
        if seq.in_tool_call or seq.after_tool_call:
            seq.spoken += 1  # never spoken, so never waited for (text pacing)
        else:
            assert embed is not None
            self.to_talker(ThinkerToken(seq.job.request_id, token, embed))
        if tags is not None and token == tags[1]:
            seq.in_tool_call, seq.after_tool_call = False, True

    def _emit_text(self, seq: ThinkerSeq, final: bool = False) -> None:
        """Emit the text the newest tokens added, decoding only a short window, not the whole reply."""
        ids = seq.generated
        before = self.tokenizer.decode(ids[seq.text_from : seq.text_to], skip_special_tokens=True)
        after = self.tokenizer.decode(ids[seq.text_from :], skip_special_tokens=True)
        # Hold back an incomplete multi-byte character until its next token arrives.
        if (after.endswith("\ufffd") and not final) or len(after) <= len(before):
            return
        seq.text_from, seq.text_to = seq.text_to, len(ids)
        self.report(TextDelta(seq.job.request_id, after[len(before) :], tuple(ids[seq.text_from : seq.text_to])))
