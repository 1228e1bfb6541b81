"""The Thinker's tensor work: prefill prompts (text + audio; whole, or after a prefix their slot holds),
decode a batch of slots one token each.

Owns the Thinker model and its KV cache. Scheduling lives in `engine/stages/thinker.py`.
The Thinker stays behind this small interface (prefill, decode, rows out) so another
backend (e.g. vLLM on a GPU host) can take its place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.cold_work import EAGER_FALLBACK, ColdWork
from engine.runners.audio_encoder import AudioEncoder
from engine.runners.kv_cache import SlotBatch, SlotKVCache, cache_kwarg
from engine.runners.replay import EAGER, PrefillReplay, StepGraphs


@dataclass(frozen=True, slots=True)
class PrefillRow:
    """One prompt's rows for a prefill forward: the whole prompt (`start` 0), or what follows the
    `start` positions its slot already holds (a reused prefix, or the chunks prefilled so far)."""

    slot: int
    token_ids: list[int]
    start: int = 0
    audio: tuple[torch.Tensor, ...] = ()  # log-mels of the clips whose placeholders are in `token_ids`, in order


@dataclass(frozen=True, slots=True)
class PrefillOut:
    logits: torch.Tensor  # [V] for the row's last position
    embeds: torch.Tensor  # [n, H] layer-0 rows (audio merged in)
    hidden: torch.Tensor | None  # [n, H] rows of `capture_layer`, when asked for


class ThinkerRunner:
    """Owns the Thinker model, its audio tower, its KV cache and its captured steps.

    `decode_kernel`: decode steps read the KV buffers in place (engine/accel/slot_attention.py has
    been applied to the model). `capture`: called once with the finished runner; what it returns
    is replayed wherever a step fits (engine/accel/cuda_graphs.py). `audio_buckets`: chunk counts
    the audio tower's batch is padded to (engine/runners/audio_encoder.py), and `audio_graphed`: the small
    ones replayed from CUDA graphs. `cold`: told of steps
    that graphs exist for but that run eagerly. `audio_timed`: told how long each tower call took."""

    def __init__(self, thinker: Any, config: Any, *, max_batch: int, max_len: int, decode_kernel: bool = False,
                 capture: Callable[[ThinkerRunner], StepGraphs] | None = None, audio_buckets: tuple[int, ...] = (),
                 audio_graphed: bool = False, cold: ColdWork | None = None,
                 audio_timed: Callable[[float], None] | None = None) -> None:
        self.thinker = thinker
        # transformers 5.2x nests the text decoder under `model.language_model`.
        self.text_model = getattr(thinker.model, "language_model", thinker.model)
        self.audio_token_id = config.thinker_config.audio_token_id
        self.audio = AudioEncoder(thinker, buckets=audio_buckets, graphed=audio_graphed, cold=cold, timed=audio_timed)
        self.cold = cold
        # hidden_states[k] is the output of decoder layer k-1 (index 0 is the embedding).
        self.capture_layer = config.talker_config.accept_hidden_layer - 1
        text_config = config.thinker_config.text_config
        param = next(thinker.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kv = SlotKVCache(
            num_layers=text_config.num_hidden_layers,
            num_slots=max_batch,
            num_kv_heads=text_config.num_key_value_heads,
            head_dim=getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads,
            max_len=max_len,
            dtype=self.dtype,
            device=self.device,
            decode_kernel=decode_kernel,
        )
        self._cache_kw = cache_kwarg(self.text_model)
        self._captured: list[torch.Tensor] = []
        self.text_model.layers[self.capture_layer].register_forward_hook(self._capture)
        self._capturing = False
        self.graphs = EAGER if capture is None else capture(self)

    def _capture(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._capturing:
            self._captured.append(output[0] if isinstance(output, tuple) else output)

    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        return self.text_model.embed_tokens(torch.as_tensor(token_ids, device=self.device))

    def prefill(self, rows: list[PrefillRow], want_hidden: bool) -> list[PrefillOut]:
        """Several prompts' rows in one forward, right-padded to the longest (replayed when graphs are
        captured: whole prompts and extends each by their own graphs).

        Padding positions write junk keys past each row's end; decode (or the next chunk) overwrites
        each of them before any query sees it.
        """
        lengths = [len(r.token_ids) for r in rows]
        ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : lengths[b]] = torch.tensor(row.token_ids)
        embeds = self.text_model.embed_tokens(ids.to(self.device, non_blocking=True))
        clips = [clip for row in rows for clip in row.audio]
        if clips:
            at_audio = ids == self.audio_token_id
            embeds[at_audio.to(self.device, non_blocking=True)] = self.audio(clips, int(at_audio.sum())).to(embeds.dtype)
        whole = [b for b, r in enumerate(rows) if r.start == 0]
        extend = [b for b, r in enumerate(rows) if r.start > 0]
        logits = torch.empty(len(rows), self.thinker.lm_head.out_features, device=self.device, dtype=self.dtype)
        hidden = torch.empty_like(embeds) if want_hidden else None
        for part, graphs in ((whole, self.graphs.prefill), (extend, self.graphs.extend)):
            if part:
                part_logits, part_hidden = self._prefill_part(embeds[part], [rows[b] for b in part], graphs, want_hidden)
                logits[part] = part_logits.to(logits.dtype)
                if hidden is not None and part_hidden is not None:
                    hidden[part, : part_hidden.shape[1]] = part_hidden
        return [
            PrefillOut(logits=logits[b], embeds=embeds[b, :n], hidden=hidden[b, :n] if hidden is not None else None)
            for b, n in enumerate(lengths)
        ]

    def _prefill_part(self, embeds: torch.Tensor, rows: list[PrefillRow], graphs: PrefillReplay | None,
                      want_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        lengths, starts, slots = [len(r.token_ids) for r in rows], [r.start for r in rows], [r.slot for r in rows]
        width = max(lengths)
        embeds = embeds[:, :width]
        if graphs is not None:
            if (runs := graphs.plan(lengths, starts)) is not None:
                return self._replay(graphs, runs, embeds, lengths, starts, slots, want_hidden)
            if self.cold is not None:
                self.cold.record(EAGER_FALLBACK, f"thinker prefill of {lengths} tokens from {starts}: no graph fits")
        view = self.kv.batch(slots, starts, width)
        self._capturing, self._captured = want_hidden, []
        try:
            out = self._forward(embeds, view)
        finally:
            self._capturing = False
        last = torch.tensor([n - 1 for n in lengths], device=self.device)
        logits = self.thinker.lm_head(out[torch.arange(len(rows), device=self.device), last])
        return logits, (self._captured[0] if want_hidden else None)

    def _replay(self, graphs: PrefillReplay, runs: list[slice], embeds: torch.Tensor, lengths: list[int],
                starts: list[int], slots: list[int], want_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = []
        hidden = torch.empty_like(embeds) if want_hidden else None
        for run in runs:
            run_logits, run_hidden = graphs(embeds[run], slots[run], lengths[run], starts[run])
            logits.append(run_logits)
            if hidden is not None:
                # a run's bucket is as long as its own longest row needs, maybe shorter than the group's
                width = min(run_hidden.shape[1], embeds.shape[1])
                hidden[run, :width] = run_hidden[:, :width]
        return torch.cat(logits), hidden

    def prefill_step(self, embeds: torch.Tensor, view: SlotBatch, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded prompts, embeds [B, L, H] -> (logits at each row's `last` [B, V], the captured
        layer's rows [B, L, H]); device work only (a CUDA graph captures this)."""
        self._capturing, self._captured = True, []
        try:
            out = self._forward(embeds, view)
        finally:
            self._capturing = False
        rows = torch.arange(out.shape[0], device=out.device)
        return self.thinker.lm_head(out[rows, last]), self._captured[0]

    def decode(self, slots: list[int], positions: list[int], token_ids: list[int]) -> torch.Tensor:
        """One token for each slot at its position -> logits [B, V]."""
        embeds = self.text_model.embed_tokens(torch.tensor(token_ids, device=self.device)).unsqueeze(1)
        if self.graphs.decode is not None:
            if out := self.graphs.decode(embeds, slots, positions):
                return out[0]
            if self.cold is not None:
                self.cold.record(EAGER_FALLBACK, f"thinker decode of {len(slots)} rows: no graph fits")
        return self.decode_step(embeds, self.kv.batch(slots, positions, 1))[0]

    def decode_step(self, embeds: torch.Tensor, view: SlotBatch) -> tuple[torch.Tensor]:
        """embeds [B, 1, H] -> (logits [B, V],); device work only (a CUDA graph captures this)."""
        return (self.thinker.lm_head(self._forward(embeds, view)[:, -1]),)

    def _forward(self, embeds: torch.Tensor, view: SlotBatch) -> torch.Tensor:
        kwargs = {**view.forward_kwargs(embeds.dtype), self._cache_kw: view}
        out = self.text_model(inputs_embeds=embeds, use_cache=True, **kwargs)
        return out.last_hidden_state
