"""The Talker's tensor work: prompt projection, one packed step of codebook 0 over any mix of prompt pieces and
speaking replies' next rows (packed_batch.py), and the code predictor.

The math follows transformers' `Qwen3OmniMoeForConditionalGeneration.generate` and the talker's
`prepare_inputs_for_generation`, reorganised so that rows arrive one text token at a time and requests of
different lengths share each forward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.metrics import ColdWork
from engine.omni.runners.code_predictor import CodePredictor, TransformersCodePredictor
from engine.omni.runners.kv_cache import SlotKVCache, cache_kwarg
from engine.omni.runners.packed_batch import (
    PackedAttention,
    PackedBatch,
    Piece,
    ReferenceAttention,
    use_packed_attention,
)
from engine.omni.runners.prefix_cache import KEPT_PER_SLOT
from engine.omni.runners.replay import EAGER, StepGraphs, run_packed
from engine.omni.runners.sampler import RowSampling, RowTensors, host_to_device, penalise_seen
from engine.positions import Grid, media_spans, mrope_positions

ASSISTANT_ROWS = 9  # the assistant header, four pads, tts_bos and the first text token (`assistant_rows`)


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """Where a Thinker prompt's rows go in the Talker prompt, from its token ids alone."""

    user_spans: tuple[tuple[int, int], ...]  # [start, end) of each user turn, <|im_start|> included
    multimodal: tuple[bool, ...]  # per row of the user turns, in order: an audio/image/video placeholder
    header: int  # where the last <|im_start|>assistant begins

    @classmethod
    def of(cls, ids: list[int], im_start: int, user: int, assistant: int, multimodal_ids: frozenset[int]) -> PromptLayout:
        # A turn runs from its <|im_start|> to the next; its role is the id right after <|im_start|>.
        starts = [i for i, t in enumerate(ids) if t == im_start]
        ends = starts[1:] + [len(ids)]
        spans = tuple((a, b) for a, b in zip(starts, ends, strict=True) if ids[min(a + 1, len(ids) - 1)] == user)
        headers = [a for a in starts if a + 1 < len(ids) and ids[a + 1] == assistant]
        if not headers:
            raise ValueError("a talker prompt needs an assistant header")
        return cls(spans, tuple(ids[i] in multimodal_ids for a, b in spans for i in range(a, b)), headers[-1])


@dataclass(frozen=True, slots=True)
class TalkerRow:
    """One reply's rows in a Talker step: a piece of its prompt, written from `start` (the rows its slot already
    holds), or the one row a speaking reply decodes."""

    slot: int
    start: int
    embeds: torch.Tensor  # [n, H]
    rope: np.ndarray | None = None  # [3, n] M-RoPE rows where they are not the positions (a prompt with images)


class TalkerRunner:
    """Owns the Talker model, its KV cache, the repetition history per slot and the captured steps. `tts_embeds`: the
    Thinker's input embeddings of tts_bos, tts_eos, tts_pad [3, thinker_hidden]. `kv_tokens`: the KV pool's rows (0:
    every slot its `max_len`). `attention`, `capture` and `cold` as the Thinker runner's."""

    def __init__(self, talker: Any, config: Any, tts_embeds: torch.Tensor, *, max_batch: int, max_len: int,
                 kv_tokens: int = 0, predictor: CodePredictor | None = None, attention: PackedAttention | None = None,
                 capture: Callable[[TalkerRunner], StepGraphs] | None = None, cold: ColdWork | None = None) -> None:
        self.talker = talker
        use_packed_attention(talker.model)
        self.attention = attention or ReferenceAttention()
        self.cold = cold
        self.config = config
        tc = config.talker_config
        param = next(talker.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.codec_embedding = talker.model.codec_embedding
        self.predictor = predictor or TransformersCodePredictor(talker.code_predictor, self.codec_embedding)
        self.num_code_groups = tc.num_code_groups
        self.codec_eos_id = tc.codec_eos_token_id
        tk = config.thinker_config
        self._multimodal_id_set = frozenset((tk.audio_token_id, tk.image_token_id, tk.video_token_id))
        self.visual_token_ids = (tk.image_token_id, tk.video_token_id)
        self.audio_token_id = tk.audio_token_id
        self.merge = tk.vision_config.spatial_merge_size
        self._codec_tracks: dict[str, torch.Tensor] = {}
        self.user_token_id = config.user_token_id
        self.im_start_id = config.im_start_token_id
        self.assistant_token_id = config.assistant_token_id
        self.codec_prefix = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
        self.codec_suffix = [tc.codec_pad_id, tc.codec_bos_id]
        self.speaker_ids: dict[str, int] = dict(tc.speaker_id or {})
        vocab = tc.text_config.vocab_size
        # The top 1024 ids are control codes that are never sampled, except codec EOS.
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.suppress[vocab - 1024 :] = True
        self.suppress[self.codec_eos_id] = False
        self.tts_bos, self.tts_eos, self.tts_pad = self.text_projection(tts_embeds.to(self.device, self.dtype))
        self.max_batch = max_batch
        self.kv = SlotKVCache.for_decoder(tc.text_config, max_batch=max_batch, max_len=max_len, dtype=self.dtype,
                                          device=self.device, pool_positions=kv_tokens,
                                          kept_slots=KEPT_PER_SLOT * max_batch)
        # per slot, the codebook-0 ids its reply has produced (the repetition penalty's history), kept on
        # the device: a step marks its tokens with one scatter, whatever the replies' lengths
        self.seen_codes = torch.zeros(self.kv.num_slots, vocab, dtype=torch.bool, device=self.device)
        self._cache_kw = cache_kwarg(talker.model)
        self.graphs = EAGER if capture is None else capture(self)

    def text_projection(self, thinker_embeds: torch.Tensor) -> torch.Tensor:
        return self.talker.text_projection(thinker_embeds.to(self.device, self.dtype))

    def prompt_embeds(
        self, token_ids: list[int], embeds: torch.Tensor, hidden: torch.Tensor, first_text: torch.Tensor, speaker: str
    ) -> torch.Tensor:
        """The whole talker prompt: `user_rows`, then `assistant_rows`. [L, H]"""
        layout = self.layout(token_ids)
        return torch.cat([self.user_rows(layout, embeds, hidden),
                          self.assistant_rows(embeds[layout.header :], first_text, speaker)])

    def layout(self, token_ids: list[int]) -> PromptLayout:
        return PromptLayout.of(token_ids, self.im_start_id, self.user_token_id, self.assistant_token_id,
                               self._multimodal_id_set)

    def user_rows(self, layout: PromptLayout, embeds: torch.Tensor, hidden: torch.Tensor, first: int = 0) -> torch.Tensor:
        """The talker prompt's rows for the Thinker prompt's positions [first, first + n): its user turns' rows [U, H],
        text projected from the Thinker's input embeddings, audio (image, video) from its hidden rows. Consecutive
        pieces' rows, joined, are the whole's. Which rows are which comes from the ids on the host, so a burst of
        prompts is queued without the host waiting on the GPU."""
        end = first + embeds.shape[0]
        spans: list[tuple[int, int]] = []
        flags: list[bool] = []
        before = 0  # `before`: user rows ahead of each span
        for a, b in layout.user_spans:
            if a < end and b > first:
                lo, hi = max(a, first), min(b, end)
                spans.append((lo - first, hi - first))
                flags += layout.multimodal[before + lo - a : before + hi - a]
            before += b - a
        if not spans:
            return self.tts_pad.new_zeros(0, self.tts_pad.shape[-1])
        embeds = embeds.to(self.device, self.dtype)
        rows = self.talker.text_projection(torch.cat([embeds[a:b] for a, b in spans]))
        if any(flags):
            hidden = hidden.to(self.device, self.dtype)
            user_hidden = torch.cat([hidden[a:b] for a, b in spans])
            multimodal = host_to_device(flags, torch.bool, self.device)
            rows = torch.where(multimodal.unsqueeze(-1), self.talker.hidden_projection(user_hidden), rows)
        return rows

    def positions(self, layout: PromptLayout, token_ids: list[int], grids: list[Grid]) -> np.ndarray:
        """[3, L]: the M-RoPE rows of a talker prompt whose user turns hold images or videos of these grids, placed
        as the Thinker places them, over the talker prompt's own rows."""
        ids = [token_ids[i] for a, b in layout.user_spans for i in range(a, b)]
        _, spans = media_spans(ids, self.audio_token_id, self.visual_token_ids)
        return mrope_positions(len(ids) + ASSISTANT_ROWS, spans, grids, self.merge)

    def assistant_rows(self, header: torch.Tensor, first_text: torch.Tensor, speaker: str) -> torch.Tensor:
        """The talker prompt's last rows [ASSISTANT_ROWS, H]: the assistant header (the Thinker's input embeddings of the
        prompt's last `<|im_start|>assistant` and its newline) and the reply's first text token on the text
        track, the speaker's codec prefix under them."""
        header = header.to(self.device, self.dtype)
        assistant = self.talker.text_projection(torch.cat([header, first_text.to(self.device, self.dtype)[None]]))
        text_track = torch.cat([assistant[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], assistant[3:4]])
        return text_track + self._codec_track(speaker)

    def _codec_track(self, speaker: str) -> torch.Tensor:
        if (track := self._codec_tracks.get(speaker)) is None:
            ids = torch.tensor(self.codec_prefix + [self.speaker_ids[speaker]] + self.codec_suffix, device=self.device)
            zeros = torch.zeros(3, self.tts_pad.shape[-1], device=self.device, dtype=self.dtype)
            track = self._codec_tracks[speaker] = torch.cat([zeros, self.codec_embedding(ids)])
        return track

    def step(self, rows: list[TalkerRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's embeds in one packed forward (replayed when a graph's bucket fits) -> per row the logits
        [N, V] and hidden [N, H] at its last position."""
        embeds = torch.cat([row.embeds for row in rows]).to(self.dtype)
        pieces = [Piece(row.slot, row.start, row.embeds.shape[0], row.rope) for row in rows]
        logits, hidden = run_packed(self.graphs, embeds, pieces,
                                    lambda: self.packed_step(embeds, PackedBatch.of(self.kv, self.attention, pieces)),
                                    self.cold, f"talker step of {embeds.shape[0]} rows in {len(rows)} replies")
        return logits, hidden

    def packed_step(self, embeds: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed rows, embeds [T, H] -> (logits [N, V], hidden [N, H]) at each sequence's last row; device work
        only (a CUDA graph captures this)."""
        kwargs = {self._cache_kw: batch, "packed": batch}
        out = self.talker.model(inputs_embeds=embeds[None], position_ids=batch.rope_positions(), use_cache=True, **kwargs)
        hidden = out.last_hidden_state[0][batch.last]
        return self.talker.codec_head(hidden), hidden

    def residual_codes(
        self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: list[RowSampling]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebooks 1..15 for each row and the frame's summed codec embedding: past_hidden [B, H], code0 [B] ->
        codes [B, num_code_groups], next talker input [B, H]."""
        settings = RowTensors.of(rows, self.device)
        if self.graphs.predictor is not None and (out := self.graphs.predictor(past_hidden, code0, settings)):
            codes, total = out
        else:
            codes, total = self.predict_residuals(past_hidden, code0, settings)
        for r in rows:
            r.draws += self.num_code_groups - 1
        return codes, total

    def predict_residuals(
        self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: RowTensors
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The 15 dependent code-predictor passes; device work only (a CUDA graph captures this)."""
        return self.predictor(past_hidden, code0, rows)

    def forget_codes(self, slots: list[int]) -> None:
        self.seen_codes[host_to_device(slots, torch.long, self.device)] = False

    def penalise_repeats(self, logits: torch.Tensor, slots: torch.Tensor, penalty: float) -> torch.Tensor:
        """logits [B, V] of the replies in `slots` [B], with the ids each already produced penalised."""
        return penalise_seen(logits, self.seen_codes[slots], penalty)

    def remember_codes(self, slots: torch.Tensor, codes: torch.Tensor) -> None:
        self.seen_codes[slots, codes] = True

    def mask_logits(self, logits: torch.Tensor, *, allow_eos: bool) -> torch.Tensor:
        suppress = self.suppress.clone() if not allow_eos else self.suppress
        if not allow_eos:
            suppress[self.codec_eos_id] = True
        return logits.masked_fill(suppress, float("-inf"))
