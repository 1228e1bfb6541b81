"""A slot-based static KV cache for continuous batching over transformers' attention layers.

Each request holds one slot (a row of every layer's K/V buffer) from prefill to
finish. A forward over any set of slots, each at its own position, goes through
`SlotKVCache.batch(...)`, which the model's attention layers call as their
`cache` (`update(k, v, layer_idx)` returns the keys/values to attend over). The
attention mask for that batch comes from the same view, so rows of different
lengths share one forward.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


def cache_kwarg(module: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` (5.2x); accept both releases."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class SlotKVCache:
    """Owns the K/V buffers and the free-slot list."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        decode_kernel: bool = False,
    ) -> None:
        """`decode_kernel`: one-token steps read the buffers in place (engine/accel/slot_attention.py)."""
        # one slot more than requests can hold: padding rows of a captured batch write there
        shape = (num_slots + 1, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.num_slots = num_slots
        self.scratch_slot = num_slots
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.decode_kernel = decode_kernel

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    def allocate(self) -> int:
        return self.free_slots.pop()

    def free(self, slot: int) -> None:
        assert slot not in self.free_slots, f"slot {slot} freed twice"
        self.free_slots.append(slot)

    def batch(self, slots: list[int], start_positions: list[int], num_new: int) -> SlotBatch:
        """A view for one forward: row b writes `num_new` tokens at `start_positions[b]`."""
        device = self.keys[0].device
        assert max(start_positions) + num_new <= self.max_len, (start_positions, num_new, self.max_len)
        return SlotBatch(
            cache=self,
            slots=torch.tensor(slots, device=device),
            starts=torch.tensor(start_positions, device=device),
            num_new=num_new,
            kv_len=max(start_positions) + num_new,
        )


@dataclass
class SlotBatch:
    cache: SlotKVCache
    slots: torch.Tensor  # [B]
    starts: torch.Tensor  # [B]
    num_new: int
    kv_len: int

    @property
    def uses_kernel(self) -> bool:
        """A one-token step that the slot decode-attention kernel serves from the buffers in place."""
        return self.cache.decode_kernel and self.num_new == 1

    # transformers' attention layers call these two; the rest of the Cache API is unused
    # because we always pass explicit position ids and a prepared 4-D mask.
    # Never compiled: its `layer_idx` picks a Python list item, which would specialise a compiled
    # decoder layer (engine/accel/cuda_graphs.py) once per layer; its writes run between regions.
    @torch.compiler.disable
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.cache.keys[layer_idx], self.cache.values[layer_idx]
        # key_states: [B, H, num_new, D]; the index pair [B, 1] x [B, num_new] addresses [B, num_new, H, D]
        positions = self.starts[:, None] + torch.arange(self.num_new, device=self.starts.device)
        keys[self.slots[:, None], :, positions] = key_states.transpose(1, 2)
        values[self.slots[:, None], :, positions] = value_states.transpose(1, 2)
        if self.uses_kernel:
            return keys, values
        return keys[self.slots, :, : self.kv_len], values[self.slots, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, num_new, kv_len]: query i of row b sees keys 0..start_b + i."""
        device = self.slots.device
        key_pos = torch.arange(self.kv_len, device=device).view(1, 1, 1, -1)
        query_pos = self.starts.view(-1, 1, 1, 1) + torch.arange(self.num_new, device=device).view(1, 1, -1, 1)
        mask = torch.zeros(key_pos.shape[-1:], dtype=dtype, device=device).expand(
            self.slots.shape[0], 1, self.num_new, self.kv_len
        )
        return mask.masked_fill(key_pos > query_pos, torch.finfo(dtype).min)

    def forward_kwargs(self, dtype: torch.dtype) -> dict:
        """What a decoder forward over this view takes besides its inputs and the cache."""
        if self.uses_kernel:  # the kernel masks by each row's length; it finds this view by name
            return {"attention_mask": None, "position_ids": self.position_ids(), "slot_view": self}
        return {"attention_mask": self.attention_mask(dtype), "position_ids": self.position_ids()}

    def position_ids(self) -> torch.Tensor:
        """Text positions [B, num_new]; text-and-audio prompts use plain positions in Qwen3-Omni."""
        return self.starts.view(-1, 1) + torch.arange(self.num_new, device=self.slots.device).view(1, -1)
