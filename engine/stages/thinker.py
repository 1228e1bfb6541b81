"""Thinker stage: schedules prefill and batched decode, streams text, feeds the Talker row by row.

Whether a decode step runs now is the first-packet policy's call (engine/stages/policy.py): with
text pacing the Thinker waits while every reply's text is far enough ahead of its speech, which
the Talker reports as it consumes rows (`SpeechProgress`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
from engine.runners.prefix_cache import Entry, PrefixCache, position_keys
from engine.runners.sampler import RowSampling, new_seed, sample
from engine.runners.thinker import PrefillRow, ThinkerRunner
from engine.stages.base import Stage
from engine.stages.policy import FirstPacketPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ThinkerSeq:
    job: AdmittedRequest
    sampling: RowSampling
    keys: np.ndarray  # per prompt position, what a cached prefix must hold there (engine/runners/prefix_cache.py)
    clips: list[tuple[int, int]]  # [start, end) of each audio clip's placeholders, in prompt order
    slot: int = -1
    position: int = 0  # tokens in the KV cache
    cached: int = 0  # of the prompt, tokens a cached prefix held
    # the Talker's prompt rows so far (when it speaks): a cached prefix's, then each prefilled piece's
    embeds: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
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

    @property
    def prompt_len(self) -> int:
        return len(self.job.token_ids)


def clip_spans(token_ids: list[int], audio_token_id: int) -> list[tuple[int, int]]:
    """Each run of audio placeholders, [start, end), in order: one per clip."""
    at = np.flatnonzero(np.asarray(token_ids) == audio_token_id)
    if not at.size:
        return []
    breaks = np.flatnonzero(np.diff(at) > 1)
    starts = np.concatenate([[at[0]], at[breaks + 1]])
    ends = np.concatenate([at[breaks] + 1, [at[-1] + 1]])
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


class ThinkerStage(Stage):
    """Owns the waiting queue, the prompts being prefilled piece by piece, the running sequences and the
    prefix cache; the runner owns the model and KV cache."""

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
        self.cache = PrefixCache(runner.kv)
        self.waiting: deque[ThinkerSeq] = deque()
        self.partial: list[ThinkerSeq] = []  # holding a slot, prompt not yet all prefilled
        self.running: dict[str, ThinkerSeq] = {}
        # decodes the running replies are owed before the next prefill (policy `decodes_after_prefill`), and
        # when the last prefill began, until the first decode after it has counted them
        self._owed_decodes = 0
        self._prefill_started: float | None = None
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
        clips = clip_spans(item.token_ids, self.runner.audio_token_id)
        keys = position_keys(item.token_ids, clips, item.audio_keys)
        grammar = None if item.grammar is None else self.grammars.start(item.grammar)
        self.waiting.append(ThinkerSeq(job=item, sampling=sampling, keys=keys, clips=clips, grammar=grammar))

    def release(self, request_id: str) -> None:
        self.waiting = deque(s for s in self.waiting if s.job.request_id != request_id)
        for piecewise in [s for s in self.partial if s.job.request_id == request_id]:
            self.partial.remove(piecewise)  # its KV is incomplete: nothing to keep
            self.runner.kv.free(piecewise.slot)
        if (seq := self.running.pop(request_id, None)) is not None:
            self._keep(seq)

    def _keep(self, seq: ThinkerSeq) -> None:
        """A finished (or aborted) request's slot stays filled for a prompt that begins the same."""
        kept = np.concatenate([seq.keys, np.asarray(seq.generated[: seq.position - seq.prompt_len], dtype=np.int64)])
        embeds = torch.cat(seq.embeds) if seq.embeds else None
        hidden = torch.cat(seq.hidden) if seq.hidden else None
        self.cache.keep(Entry(seq.slot, kept, seq.prompt_len, embeds, hidden))

    def has_work(self) -> bool:
        return self._wants_decode() or bool(self.partial) or (bool(self.waiting) and self.cache.num_free > 0)

    def _wants_decode(self) -> bool:
        return self.policy.thinker_may_decode(self.running.values())

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.partial)

    def num_running(self) -> int:
        return len(self.running)

    def step(self) -> list[str]:
        # prefill first: a new request's first token matters more than one more token for the others
        # (and `has_work` said a decode is wanted when this is not so); but while a running reply wants
        # text, only once its text has kept up with its speech, so a burst of long prompts stalls nobody
        if self._owed_decodes and self._wants_decode():
            return self._decode()
        if self.partial or (self.waiting and self.cache.num_free > 0):
            return self._prefill(self._take_prefill_group())
        return self._decode()

    def _piece_end(self, seq: ThinkerSeq) -> int:
        """Where the next prefill piece of `seq` ends: at most `prefill_chunk` on, never inside a clip."""
        end = min(seq.prompt_len, seq.position + self.cfg.prefill_chunk)
        for a, b in seq.clips:
            if a < end < b:
                end = a if a > seq.position else b
        return end

    def _take_prefill_group(self) -> list[ThinkerSeq]:
        """Prompts for one prefill forward, pieces under way first: as many as fit the free slots and the
        token budget (a waiting prompt is measured whole, before a cached prefix shortens it)."""
        group: list[ThinkerSeq] = []
        longest = 0
        while True:
            if len(group) < len(self.partial):
                seq = self.partial[len(group)]
            elif self.waiting and self.cache.num_free > 0:
                seq = self.waiting[0]
            else:
                break
            width = self._piece_end(seq) - seq.position
            # large enough to batch a burst of arrivals, small enough not to stall everyone's decode
            if group and max(longest, width) * (len(group) + 1) > self.cfg.prefill_token_budget:
                break
            if seq.slot < 0:
                self.partial.append(self._start(self.waiting.popleft()))
            group.append(seq)
            longest = max(longest, width)
        return group

    def _start(self, seq: ThinkerSeq) -> ThinkerSeq:
        """Give a waiting prompt its slot: one holding its longest cached prefix, or a fresh one."""
        reuse = self.cache.claim(seq.keys, seq.clips, want_hidden=seq.job.want_audio)
        if reuse is None:
            seq.slot = self.cache.allocate()
            return seq
        seq.slot, seq.position, seq.cached = reuse.slot, reuse.length, reuse.length
        if seq.job.want_audio:
            assert reuse.embeds is not None and reuse.hidden is not None
            seq.embeds, seq.hidden = [reuse.embeds], [reuse.hidden]
            if (reply := reuse.length - reuse.embeds.shape[0]) > 0:
                # the cached reply's rows: text, which the Talker reads only from user turns
                seq.embeds.append(self.runner.embed(seq.job.token_ids[reuse.embeds.shape[0] : reuse.length]))
                seq.hidden.append(reuse.hidden.new_zeros(reply, reuse.hidden.shape[-1]))
        return seq

    def _prefill(self, seqs: list[ThinkerSeq]) -> list[str]:
        self._prefill_started, self._owed_decodes = time.perf_counter(), 1
        self.last_phase = "prefill"
        self.last_batch = [s.job.request_id for s in seqs]
        ends = [self._piece_end(s) for s in seqs]
        rows = []
        for seq, end in zip(seqs, ends, strict=True):
            clips = tuple(f for (a, _), f in zip(seq.clips, seq.job.audio_features, strict=True) if seq.position <= a < end)
            rows.append(PrefillRow(seq.slot, seq.job.token_ids[seq.position : end], seq.position, clips))
        want_hidden = any(s.job.want_audio for s in seqs)
        outs = self.runner.prefill(rows, want_hidden=want_hidden)
        done = [(seq, out) for seq, out, end in zip(seqs, outs, ends, strict=True) if end == seq.prompt_len]
        for seq, out, end in zip(seqs, outs, ends, strict=True):
            seq.position = end
            if seq.job.want_audio:
                assert out.hidden is not None
                seq.embeds.append(out.embeds)
                seq.hidden.append(out.hidden)
        if not done:
            return self.last_batch
        tokens, embeds = self._sample(torch.stack([o.logits for _, o in done]), [s for s, _ in done])
        for (seq, _), token, embed in zip(done, tokens, embeds, strict=True):
            job = seq.job
            self.partial.remove(seq)
            self.running[job.request_id] = seq
            if job.want_audio:
                if len(seq.embeds) > 1:
                    seq.embeds, seq.hidden = [torch.cat(seq.embeds)], [torch.cat(seq.hidden)]
                self.to_talker(
                    ThinkerPrompt(job.request_id, job.token_ids, seq.embeds[0], seq.hidden[0], job.speaker, job.seed)
                )
            self._advance(seq, token, embed)
        return self.last_batch

    def _decode(self) -> list[str]:
        self.last_phase = "decode"
        seqs = list(self.running.values())
        self.last_batch = [s.job.request_id for s in seqs]
        logits = self.runner.decode([s.slot for s in seqs], [s.position for s in seqs], [s.generated[-1] for s in seqs])
        tokens, embeds = self._sample(logits, seqs)  # the host waits for the GPU here: the cycle is over
        if self._prefill_started is not None:
            self._owed_decodes = self.policy.decodes_after_prefill(time.perf_counter() - self._prefill_started)
            self._prefill_started = None
        self._owed_decodes = max(0, self._owed_decodes - 1)
        for seq, token, embed in zip(seqs, tokens, embeds, strict=True):
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
