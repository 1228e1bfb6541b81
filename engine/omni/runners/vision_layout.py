"""What the vision tower needs of its images' grids, laid out on the host, and its attention over them.

transformers' tower derives from the grids (a device tensor) each patch's position-embedding taps, its rotary
positions and the images' boundaries, and its attention reads those boundaries back (`.tolist()`) in every one of
its 27 layers: each step with pictures waited for the GPU ~30 times while the other stages shared it. The grids
are known on the host, so the taps and positions are made once per grid (the same camera sends the same size all
call long) and handed to the tower as the precomputed values its helpers accept, and each layer's attention
(`GridAttention`, in place of the tower's own) takes the images' lengths from the host: equal lengths, the common
case, as one batched call, where the tower made one call per image."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling
from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

Grid = tuple[int, int, int]  # temporal, height, width patches


@dataclass(frozen=True, slots=True)
class GridLayout:
    """One call's images laid out: what the tower's helpers would derive from `grid_thw`, and each attention
    sequence's length (a video's frames each attend alone, as the tower's `cu_seqlens` says)."""

    grid_thw: torch.Tensor  # [images, 3] on the tower's device
    tensors: dict[str, torch.Tensor | int]  # the tower's precomputed keyword arguments
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, tower: Any, grids: list[Grid], device: torch.device) -> GridLayout:
        table = (tower.num_grid_per_side, tower.interpolation_mode, tower.interpolation_align_corners,
                 tower.spatial_merge_size)
        return _layout(table, tuple(grids), device)


# the steps of a call with pictures repeat their grids (one camera's frames, a batch of one size): nothing of a
# repeated layout crosses to the device again, which would wait for the device's queue each time
@functools.lru_cache(maxsize=16)
def _layout(table: tuple[int, str, bool, int], grids: tuple[Grid, ...], device: torch.device) -> GridLayout:
    parts = [_grid_layout(table, grid, device) for grid in grids]
    lengths = tuple(n for grid in grids for n in [grid[1] * grid[2]] * grid[0])
    bounds = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    return GridLayout(torch.tensor(grids, device=device),
                      {"interp_indices": torch.cat([p[0] for p in parts]),
                       "interp_weights": torch.cat([p[1] for p in parts]),
                       "position_ids": torch.cat([p[2] for p in parts]),
                       "cu_seqlens": bounds, "max_seqlen": max(lengths)}, lengths)


@functools.lru_cache(maxsize=64)
def _grid_layout(table: tuple[int, str, bool, int], grid: Grid,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image's taps, weights and rotary positions, by transformers' own helpers on the host, then moved once.
    `table`: how the tower resamples its position table (side, mode, align_corners) and merges patches."""
    side, mode, align_corners, merge = table
    on_host = torch.tensor([grid])
    indices, weights = get_vision_interpolation_indices_and_weights(
        on_host, num_grid_per_side=side, mode=mode, align_corners=align_corners, spatial_merge_size=merge)
    positions = get_vision_position_ids(on_host, merge)
    return indices.to(device), weights.to(device), positions.to(device)


class GridAttention(torch.nn.Module):
    """A tower layer's attention, its weights the layer's own, over sequences of `lengths` (set for each call)."""

    def __init__(self, attention: Any) -> None:
        super().__init__()
        self.qkv, self.proj = attention.qkv, attention.proj
        self.heads, self.scale = attention.num_heads, attention.scaling
        self.lengths: tuple[int, ...] = ()

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                **_: Any) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).reshape(tokens, 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = modeling.apply_rotary_pos_emb_vision(q, k, *position_embeddings)
        lengths = self.lengths
        if len(set(lengths)) == 1:  # [images, heads, length, dim]: one call
            q, k, v = (x.reshape(len(lengths), lengths[0], self.heads, -1).transpose(1, 2) for x in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scale).transpose(1, 2)
        else:
            out = torch.cat([self._one(*seq) for seq in zip(*(x.split(lengths) for x in (q, k, v)), strict=True)])
        return self.proj(out.reshape(tokens, -1))

    def _one(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One sequence's [length, heads, dim] attention."""
        q, k, v = (x[None].transpose(1, 2) for x in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, scale=self.scale).transpose(1, 2)[0]
