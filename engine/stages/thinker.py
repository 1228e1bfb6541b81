"""Thinker stage: schedules prefill and batched decode, streams text, feeds the Talker row by row.

Whether a decode step runs now is the first-packet policy's call (engine/stages/policy.py): with
text pacing the Thinker waits while every reply's text is far enough ahead of its speech, which
the Talker reports as it consumes rows (`SpeechProgress`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.api import TextDelta
from engine.grammar import Grammars, GrammarState
from engine.handoff import (
    AdmittedRequest,
    Inbox,
    Report,
    SpeechProgress,
    ThinkerDone,
    ThinkerFinished,
    ThinkerPrompt,
    ThinkerToken,
)
from engine.metrics import EngineMetrics
from engine.profile import ThinkerConfig
from engine.runners.sampler import RowSampling, new_seed, sample
from engine.runners.thinker import ThinkerRunner
from engine.stages.base import Stage
from engine.stages.policy import FirstPacketPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ThinkerSeq:
    job: AdmittedRequest
    sampling: RowSampling
    slot: int = -1
    position: int = 0  # tokens in the KV cache
    generated: list[int] = field(default_factory=list)
    # incremental detokenisation: ids before `text_from` are emitted and never decoded again;
    # [text_from, text_to) were decoded last time and give the context for the next piece
    text_from: int = 0
    text_to: int = 0
    spoken: int = 0  # text rows the Talker has consumed (when pacing), and those it never gets
    talker_done: bool = False
    grammar: GrammarState | None = None  # a constrained reply's place in its grammar
    in_tool_call: bool = False  # inside <tool_call>...</tool_call>: text the Talker never gets
    after_tool_call: bool = False  # and the whitespace after it (between calls) neither

    @property
    def paced(self) -> bool:
        return self.job.want_audio and not self.talker_done

    @property
    def made(self) -> int:
        return len(self.generated)


class ThinkerStage(Stage):
    """Owns the waiting queue and the running sequences; the runner owns the model and KV cache."""

    kind = "thinker"

    def __init__(
        self,
        runner: ThinkerRunner,
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
        self.waiting: deque[ThinkerSeq] = deque()
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
        grammar = None if item.grammar is None else self.grammars.start(item.grammar)
        self.waiting.append(ThinkerSeq(job=item, sampling=sampling, grammar=grammar))

    def release(self, request_id: str) -> None:
        self.waiting = deque(s for s in self.waiting if s.job.request_id != request_id)
        seq = self.running.pop(request_id, None)
        if seq is not None:
            self.runner.kv.free(seq.slot)

    def has_work(self) -> bool:
        return self._wants_decode() or (bool(self.waiting) and self.runner.kv.num_free > 0)

    def _wants_decode(self) -> bool:
        return self.policy.thinker_may_decode(self.running.values())

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running)

    def step(self) -> list[str]:
        # prefill first: a new request's first token matters more than one more token for the others
        # (and `has_work` said a decode is wanted when this is not so)
        if self.waiting and self.runner.kv.num_free > 0:
            return self._prefill(self._take_prefill_group())
        return self._decode()

    def _take_prefill_group(self) -> list[ThinkerSeq]:
        """Waiting requests for one prefill forward: as many as fit the free slots and the token budget."""
        group = [self.waiting.popleft()]
        padded = len(group[0].job.token_ids)
        while self.waiting and len(group) < self.runner.kv.num_free:
            longest = max(padded // len(group), len(self.waiting[0].job.token_ids))
            # large enough to batch a burst of arrivals, small enough not to stall everyone's decode
            if longest * (len(group) + 1) > self.cfg.prefill_token_budget:
                break
            group.append(self.waiting.popleft())
            padded = longest * len(group)
        return group

    def _prefill(self, seqs: list[ThinkerSeq]) -> list[str]:
        for seq in seqs:
            seq.slot = self.runner.kv.allocate()
            self.running[seq.job.request_id] = seq
        self.last_batch = [s.job.request_id for s in seqs]
        outs = self.runner.prefill(
            [s.slot for s in seqs],
            [s.job.token_ids for s in seqs],
            [s.job.audio_features for s in seqs],
            want_hidden=any(s.job.want_audio for s in seqs),
        )
        tokens, embeds = self._sample(torch.stack([o.logits for o in outs]), seqs)
        for seq, out, token, embed in zip(seqs, outs, tokens, embeds):
            job = seq.job
            seq.position = len(job.token_ids)
            if job.want_audio:
                assert out.hidden is not None
                self.to_talker(
                    ThinkerPrompt(job.request_id, job.token_ids, out.embeds, out.hidden, job.speaker, job.seed)
                )
            self._advance(seq, token, embed)
        return self.last_batch

    def _decode(self) -> list[str]:
        seqs = list(self.running.values())
        self.last_batch = [s.job.request_id for s in seqs]
        logits = self.runner.decode([s.slot for s in seqs], [s.position for s in seqs], [s.generated[-1] for s in seqs])
        tokens, embeds = self._sample(logits, seqs)
        for seq, token, embed in zip(seqs, tokens, embeds):
            seq.position += 1
            self._advance(seq, token, embed)
        return self.last_batch

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
                ThinkerFinished(job.request_id, "stop" if is_eos else "length", len(job.token_ids), len(seq.generated))
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
