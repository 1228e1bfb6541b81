"""The Thinker's tensor work: one packed step over any mix of prompt pieces (text, audio and images; whole, or
after what their slot holds) and replies' next tokens (packed_batch.py).

A step with images replays the same graphs as any other: the vision tower's "deepstack" rows, added inside the
first decoder layers at the images' places, go in dense (zeros elsewhere) and are added whole, where
transformers picks the images' rows by a mask (a host sync, which no graph can hold). A step no graph fits runs
eagerly; its kernels are met once at start-up (`warm_eager`). Scheduling lives in engine/omni/stages/thinker.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from engine.handoff import ImageInput
from engine.metrics import ColdWork
from engine.omni.runners.audio_encoder import AudioEncoder
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
from engine.omni.runners.vision_tower import QWEN_NORMALISATION, Normalisation, VisionTower


@dataclass(frozen=True, slots=True)
class StepRow:
    """One sequence's rows in a step: a prompt's piece (the whole prompt from `start` 0, or what follows the
    `start` positions its slot already holds: a reused prefix, the pieces so far), or a reply's last token."""

    slot: int
    token_ids: list[int]
    start: int = 0
    audio: tuple[torch.Tensor, ...] = ()  # log-mels of the clips whose placeholders are in `token_ids`, in order
    images: tuple[ImageInput, ...] = ()  # the images whose placeholders are in `token_ids`, in order
    rope: np.ndarray | None = None  # [3, n] M-RoPE rows, where they are not the positions (engine/intake/images.py)


@dataclass(frozen=True, slots=True)
class RowOut:
    logits: torch.Tensor  # [V] for the row's last position
    embeds: torch.Tensor  # [n, H] layer-0 rows (audio merged in)
    hidden: torch.Tensor  # [n, H] rows of `capture_layer`


class StepRunner(Protocol):
    """What the Thinker stage steps: this module's `ThinkerRunner`, or another language model behind the same face
    (the cascade's, engine/cascade/brain.py)."""

    device: torch.device
    kv: SlotKVCache

    @property
    def audio_token_id(self) -> int | None:
        """The clips' placeholder; None: it takes no audio."""
        ...

    @property
    def visual_token_ids(self) -> tuple[int, ...]:
        """The image's and the video's placeholders; none: it takes no images."""
        ...

    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor: ...

    def audio_chunks(self, clip: torch.Tensor) -> int:
        ...

    def step(self, rows: list[StepRow]) -> list[RowOut]: ...


class ThinkerRunner:
    """Owns the Thinker model, its audio tower, its KV cache and its captured steps. `attention`: packed attention over
    the slots (the Triton kernel on a GPU; the reference by default). `capture`: called once with the finished
    runner; what it returns is replayed wherever a step fits. `audio_buckets`: chunk counts the audio tower's batch is
    padded to (replayed from graphs under `audio_graphed`). `cold`: told of steps that run eagerly though graphs
    exist. `kv_tokens`: the KV cache's positions for all slots (0: each its `max_len`)."""

    def __init__(self, thinker: Any, config: Any, *, max_batch: int, max_len: int,
                 attention: PackedAttention | None = None,
                 capture: Callable[[ThinkerRunner], StepGraphs] | None = None, audio_buckets: tuple[int, ...] = (),
                 audio_graphed: bool = False, cold: ColdWork | None = None,
                 audio_timed: Callable[[float], None] | None = None,
                 vision_timed: Callable[[float], None] | None = None, kv_tokens: int = 0,
                 image_normalisation: Normalisation = QWEN_NORMALISATION) -> None:
        self.thinker = thinker
        # transformers 5.2x nests the text decoder under `model.language_model`.
        self.text_model = getattr(thinker.model, "language_model", thinker.model)
        use_packed_attention(self.text_model)
        self.attention = attention or ReferenceAttention()
        self.audio_token_id = config.thinker_config.audio_token_id
        tc = config.thinker_config
        self.visual_token_ids = (tc.image_token_id, tc.video_token_id)
        self.audio = AudioEncoder(thinker, buckets=audio_buckets, graphed=audio_graphed, cold=cold, timed=audio_timed)
        self.vision = VisionTower(thinker, normalisation=image_normalisation, timed=vision_timed)
        self.deepstack_layers = len(tc.vision_config.deepstack_visual_indexes)
        self.text_model._deepstack_process = _add_dense
        self.cold = cold
        # hidden_states[k] is the output of decoder layer k-1 (index 0 is the embedding).
        self.capture_layer = config.talker_config.accept_hidden_layer - 1
        text_config = config.thinker_config.text_config
        param = next(thinker.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_batch = max_batch
        self.kv = SlotKVCache.for_decoder(text_config, max_batch=max_batch, max_len=max_len, dtype=self.dtype,
                                          device=self.device, pool_positions=kv_tokens,
                                          kept_slots=KEPT_PER_SLOT * max_batch)
        self._cache_kw = cache_kwarg(self.text_model)
        self._captured: list[torch.Tensor] = []
        self.text_model.layers[self.capture_layer].register_forward_hook(self._capture)
        self.graphs = EAGER if capture is None else capture(self)

    def _capture(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._captured.append(output[0] if isinstance(output, tuple) else output)

    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        return self.text_model.embed_tokens(torch.as_tensor(token_ids, device=self.device))

    def audio_chunks(self, clip: torch.Tensor) -> int:
        return self.audio.chunks(clip)

    def step(self, rows: list[StepRow]) -> list[RowOut]:
        """Every row's tokens in one packed forward (replayed when a graph's bucket fits) -> per row the logits
        at its last position, its layer-0 rows and its captured layer's rows."""
        ids = [t for row in rows for t in row.token_ids]
        host_ids = torch.tensor(ids)
        embeds = self.text_model.embed_tokens(host_ids.to(self.device, non_blocking=True))
        # placeholders' rows by index, found on the host: a mask on the device would make each step wait for it
        clips = [clip for row in rows for clip in row.audio]
        if clips:
            at_audio = (host_ids == self.audio_token_id).nonzero().squeeze(1)
            embeds[at_audio.to(self.device, non_blocking=True)] = self.audio(clips, len(at_audio)).to(embeds.dtype)
        pieces = [Piece(r.slot, r.start, len(r.token_ids), r.rope) for r in rows]
        deepstack = None
        if images := [image for row in rows for image in row.images]:
            at_image = torch.isin(host_ids, torch.tensor(self.visual_token_ids)).nonzero().squeeze(1)
            at_image = at_image.to(self.device, non_blocking=True)
            vision = self.vision(images)
            embeds[at_image] = vision.embeds.to(embeds.dtype)
            deepstack = embeds.new_zeros(len(vision.deepstack), *embeds.shape)
            deepstack[:, at_image] = torch.stack(vision.deepstack).to(embeds.dtype)
        logits, hidden = run_packed(
            self.graphs, embeds, pieces,
            lambda: self.packed_step(embeds, PackedBatch.of(self.kv, self.attention, pieces), deepstack),
            self.cold, f"thinker step of {len(ids)} tokens in {len(rows)} rows", deepstack)
        outs, first = [], 0
        for b, row in enumerate(rows):
            end = first + len(row.token_ids)
            outs.append(RowOut(logits[b], embeds[first:end], hidden[first:end]))
            first = end
        return outs

    def warm_eager(self) -> int:
        """Runs once at start-up what a step runs uncaptured (both attention tables, the experts' decode and prefill
        tiles), so that its kernels compile now, not under a user's step; their slots are given back."""
        kv = self.kv
        slots = [kv.allocate() for _ in range(2 if kv.num_slots > 1 and kv.num_pages > 1 else 1)]
        # the first slot's piece in the pages the others' one row leaves it
        longest = min(kv.max_len, (kv.num_pages - len(slots) + 1) * kv.page_size) - 1
        firsts = (min(17, longest), min(511, longest))
        for first in firsts:
            pieces = [Piece(slot, 0, first if i == 0 else 1) for i, slot in enumerate(slots)]
            self.packed_step(self.embed([0] * (first + len(slots) - 1)), PackedBatch.of(kv, self.attention, pieces))
        for slot in reversed(slots):  # the free list as it was
            kv.free(slot)
        return len(firsts)

    def packed_step(self, embeds: torch.Tensor, batch: PackedBatch,
                    deepstack: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed rows, embeds [T, H] -> (logits at each sequence's last token [N, V], the captured layer's rows
        [T, H]); device work only (a CUDA graph captures this). `deepstack` [layers, T, H]: what the images add
        after each of the first decoder layers, zeros at every other row."""
        self._captured = []
        kwargs: dict[str, Any] = {self._cache_kw: batch, "packed": batch}
        if deepstack is not None:
            kwargs["deepstack_visual_embeds"] = deepstack.unbind()
        out = self.text_model(inputs_embeds=embeds[None], position_ids=batch.rope_positions(), use_cache=True, **kwargs)
        hidden = out.last_hidden_state[0]
        return self.thinker.lm_head(hidden[batch.last]), self._captured[0][0]


def _add_dense(hidden: torch.Tensor, mask: Any, rows: torch.Tensor) -> torch.Tensor:
    """The text model's deepstack step, for rows given dense ([T, H], zeros off the images): added whole. Adding a
    zero leaves a row as it was, so this equals transformers' masked add."""
    return hidden + rows
