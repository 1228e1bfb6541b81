"""A slot-based static KV cache for continuous batching over transformers' attention layers.

Each request holds one slot (a row of every layer's K/V buffer) from its first prompt piece to its
finish. A forward over any set of slots, each at its own position, goes through a packed batch
(engine/runners/packed_batch.py), which the model's attention layers call as their `cache`.
"""

from __future__ import annotations

import inspect
from typing import Any

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
    ) -> None:
        # one slot more than requests can hold: padding rows of a captured batch write there
        shape = (num_slots + 1, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.num_slots = num_slots
        self.scratch_slot = num_slots
        self.free_slots = list(range(num_slots - 1, -1, -1))

    @classmethod
    def for_decoder(cls, config: Any, *, num_slots: int, max_len: int, dtype: torch.dtype,
                    device: torch.device | str) -> SlotKVCache:
        """The cache of a transformers decoder with `config` (its layers, KV heads and head size)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(num_layers=config.num_hidden_layers, num_slots=num_slots, num_kv_heads=config.num_key_value_heads,
                   head_dim=head_dim, max_len=max_len, dtype=dtype, device=device)

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    def allocate(self) -> int:
        return self.free_slots.pop()

    def free(self, slot: int) -> None:
        assert slot not in self.free_slots, f"slot {slot} freed twice"
        self.free_slots.append(slot)
