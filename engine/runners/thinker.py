"""The Thinker's tensor work: prefill one prompt (text + audio), decode a batch of slots one token each.

Owns the Thinker model and its KV cache. Scheduling lives in `engine/stages/thinker.py`.
The Thinker stays behind this small interface (prefill, decode, rows out) so another
backend (e.g. vLLM on a GPU host) can take its place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.runners.kv_cache import SlotBatch, SlotKVCache, cache_kwarg
from engine.runners.replay import EAGER, StepGraphs


@dataclass(frozen=True, slots=True)
class PrefillOut:
    logits: torch.Tensor  # [V] for the last prompt position
    embeds: torch.Tensor  # [L, H] layer-0 rows (audio merged in)
    hidden: torch.Tensor | None  # [L, H] rows of `capture_layer`, when asked for


class ThinkerRunner:
    """Owns the Thinker model, its KV cache and its captured steps.

    `decode_kernel`: decode steps read the KV buffers in place (engine/accel/slot_attention.py has
    been applied to the model). `capture`: called once with the finished runner; what it returns
    is replayed wherever a step fits (engine/accel/cuda_graphs.py)."""

    def __init__(self, thinker: Any, config: Any, *, max_batch: int, max_len: int, decode_kernel: bool = False,
                 capture: Callable[[ThinkerRunner], StepGraphs] | None = None) -> None:
        self.thinker = thinker
        # transformers 5.2x nests the text decoder under `model.language_model`.
        self.text_model = getattr(thinker.model, "language_model", thinker.model)
        self.audio_token_id = config.thinker_config.audio_token_id
        self.n_window = config.thinker_config.audio_config.n_window
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

    def prefill(
        self, slots: list[int], prompts: list[list[int]], audio: list[list[torch.Tensor]], want_hidden: bool
    ) -> list[PrefillOut]:
        """Several prompts in one forward, right-padded to the longest (replayed when graphs are captured).

        Padding positions write junk keys past each prompt's end; decode overwrites each of them in
        the very step that first lets a query see it, so nothing reads them.
        """
        lengths = [len(p) for p in prompts]
        ids = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
        for b, prompt in enumerate(prompts):
            ids[b, : len(prompt)] = torch.tensor(prompt)
        ids = ids.to(self.device)
        embeds = self.text_model.embed_tokens(ids)
        for b, features in enumerate(audio):
            if features:
                merged = self._merge_audio(ids[b : b + 1, : lengths[b]], embeds[b : b + 1, : lengths[b]], features)
                embeds[b, : lengths[b]] = merged[0]
        graphs = self.graphs.prefill
        if graphs is not None and not any(audio) and (runs := graphs.plan(lengths)) is not None:
            outs = [graphs(embeds[run], slots[run], lengths[run]) for run in runs]
            logits, hidden = torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
        else:
            view = self.kv.batch(slots, [0] * len(prompts), max(lengths))
            self._capturing, self._captured = want_hidden, []
            try:
                out = self._forward(embeds, view)
            finally:
                self._capturing = False
            last = torch.tensor([n - 1 for n in lengths], device=self.device)
            logits = self.thinker.lm_head(out[torch.arange(len(prompts), device=self.device), last])
            hidden = self._captured[0] if want_hidden else None  # type: ignore[assignment]
        return [
            PrefillOut(logits=logits[b], embeds=embeds[b, :n], hidden=hidden[b, :n] if want_hidden else None)
            for b, n in enumerate(lengths)
        ]

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
        if self.graphs.decode is not None and (out := self.graphs.decode(embeds, slots, positions)):
            return out[0]
        return self.decode_step(embeds, self.kv.batch(slots, positions, 1))[0]

    def decode_step(self, embeds: torch.Tensor, view: SlotBatch) -> tuple[torch.Tensor]:
        """embeds [B, 1, H] -> (logits [B, V],); device work only (a CUDA graph captures this)."""
        return (self.thinker.lm_head(self._forward(embeds, view)[:, -1]),)

    def _forward(self, embeds: torch.Tensor, view: SlotBatch) -> torch.Tensor:
        kwargs = {**view.forward_kwargs(embeds.dtype), self._cache_kw: view}
        out = self.text_model(inputs_embeds=embeds, use_cache=True, **kwargs)
        return out.last_hidden_state

    def _merge_audio(self, ids: torch.Tensor, embeds: torch.Tensor, features: list[torch.Tensor]) -> torch.Tensor:
        lengths = torch.tensor([f.shape[-1] for f in features], device=self.device)
        batch = torch.zeros(len(features), features[0].shape[0], int(lengths.max()), device=self.device, dtype=self.dtype)
        mask = torch.zeros(len(features), int(lengths.max()), dtype=torch.long, device=self.device)
        for i, f in enumerate(features):
            batch[i, :, : f.shape[-1]] = f.to(self.device, self.dtype)
            mask[i, : f.shape[-1]] = 1
        audio = self.thinker.get_audio_features(batch, feature_attention_mask=mask).last_hidden_state
        positions = ids[0] == self.audio_token_id
        assert int(positions.sum()) == audio.shape[0], (int(positions.sum()), audio.shape)
        embeds = embeds.clone()
        embeds[0, positions] = audio.to(embeds.dtype)
        return embeds
