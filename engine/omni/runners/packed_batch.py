"""One packed forward over the slot KV cache: decode rows and prompt pieces as unpadded tokens.

A step is a list of `Piece`s, each one sequence's rows (a prompt's next piece, or a reply's next token), packed
end to end as `[T]` rows; each token writes its key and value at its slot's position (a page and an offset) and
attends causally over what its slot holds. No 4-D mask and no copy out of the pages; a piece after a cached prefix
simply starts where its slot ends. A CUDA graph pads a step to its bucket: padding tokens write the scratch page
and read zeros, padding sequences have none. Every index a step needs lives in one int64 tensor, filled by one
copy from the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from engine.omni.runners.kv_cache import SlotKVCache

PACKED_ATTENTION = "vg_packed"
# query tokens of a small-table block (decode rows): with the Thinker's 8 query heads per key/value head,
# 2 tokens fill the 16 rows of the smallest tile tl.dot takes. Fixed rather than derived from the group
# so the host's tables need no model shape; a group under 8 pads the tile's rows up to 16 in the kernel.
SMALL_Q = 2


@dataclass(frozen=True, slots=True)
class Piece:
    """One sequence's rows in a step: `length` tokens written from `start`, the positions its slot holds. `rope`: their
    M-RoPE rows [3, length] where they are not the slot's positions (a prompt with images, and its reply)."""

    slot: int
    start: int
    length: int
    rope: np.ndarray | None = None


class PackedAttention(Protocol):
    """Attention of packed queries over the slots; `block_q`: query tokens per block of the big table (the
    sequences longer than `SMALL_Q`), 0 when the implementation needs no block tables."""

    block_q: int

    def __call__(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: PackedBatch,
                 scale: float) -> torch.Tensor:
        """query [T, Hq, D], keys/values [pages, Hkv, page_size, D] (the cache's whole buffers) -> [T, Hq, D]."""
        ...


def query_blocks(lengths: list[int], block_q: int, num_blocks: int | None = None) -> tuple[list[int], list[int]]:
    """The kernel's work list: each block of up to `block_q` query tokens of one sequence, as (its sequence's
    index, its first query's index within the sequence), padded with (-1, 0) to `num_blocks` when given."""
    seqs, firsts = [], []
    for n, length in enumerate(lengths):
        for first in range(0, length, block_q):
            seqs.append(n)
            firsts.append(first)
    if num_blocks is not None:
        assert len(seqs) <= num_blocks, (len(seqs), num_blocks)
        pad = num_blocks - len(seqs)
        seqs, firsts = seqs + [-1] * pad, firsts + [0] * pad
    return seqs, firsts


def num_blocks(tokens: int, seqs: int, block_q: int) -> int:
    """Big-table blocks any `seqs` sequences of `tokens` tokens can need: each may end one block early."""
    return 0 if block_q == 0 else -(-tokens // block_q) + seqs


def block_tables(lengths: list[int], block_q: int, tokens: int, seqs: int) -> tuple[list[int], list[int], list[int]]:
    """The kernel's two work lists for a step of (`tokens`, `seqs`): the small table (each sequence of 1..SMALL_Q
    tokens, padded with -1 to `seqs`) and the big table (`query_blocks` of the longer ones, padded to `num_blocks`)."""
    small = [n for n, length in enumerate(lengths) if 0 < length <= SMALL_Q]
    assert len(small) <= seqs, (len(small), seqs)
    long = [length if length > SMALL_Q else 0 for length in lengths]
    big_seq, big_first = query_blocks(long, block_q, num_blocks(tokens, seqs, block_q))
    return small + [-1] * (seqs - len(small)), big_seq, big_first


class PackedBatch:
    """The view one forward takes as its cache, all views of `meta`: per token its page, offset, position and
    M-RoPE rows; per sequence its start, first token, length, last token and page list ([N, pages_per_slot]);
    the kernel's block tables. `pieces`: the host's copy (None in a graph's static batch)."""

    def __init__(self, cache: SlotKVCache, attention: PackedAttention, tokens: int, seqs: int,
                 meta: torch.Tensor, pieces: list[Piece] | None = None) -> None:
        self.cache = cache
        self.attention = attention
        self.tokens, self.seqs = tokens, seqs
        self.meta = meta
        self.pieces = pieces
        sizes = _part_sizes(tokens, seqs, attention.block_q, cache.pages_per_slot)
        (self.token_page, self.token_offset, self.token_pos, self.seq_start, self.seq_q0, self.seq_len, self.last,
         self.small_seq, self.block_seq, self.block_q, self.rope, seq_pages) = (
            part[:n] for part, n in zip(meta.split([_aligned(n) for n in sizes]), sizes, strict=True))
        self.seq_pages = seq_pages.view(seqs, cache.pages_per_slot)

    @classmethod
    def static(cls, cache: SlotKVCache, attention: PackedAttention, tokens: int, seqs: int) -> PackedBatch:
        """A graph's batch: every token in the scratch page, no sequence (what a capture runs)."""
        size = cls.meta_size(tokens, seqs, attention.block_q, cache.pages_per_slot)
        batch = cls(cache, attention, tokens, seqs, torch.zeros(size, dtype=torch.long, device=cache.keys[0].device))
        batch.meta.copy_(torch.from_numpy(batch.layout([])))
        return batch

    @classmethod
    def of(cls, cache: SlotKVCache, attention: PackedAttention, pieces: list[Piece]) -> PackedBatch:
        tokens = sum(p.length for p in pieces)
        host = torch.from_numpy(_layout(cache, attention.block_q, tokens, len(pieces), pieces))
        return cls(cache, attention, tokens, len(pieces), host.to(cache.keys[0].device, non_blocking=True), pieces)

    @staticmethod
    def meta_size(tokens: int, seqs: int, block_q: int, pages_per_slot: int) -> int:
        return sum(_aligned(n) for n in _part_sizes(tokens, seqs, block_q, pages_per_slot))

    def layout(self, pieces: list[Piece]) -> np.ndarray:
        """`meta`'s contents for these pieces, padded to this batch's tokens and sequences."""
        return _layout(self.cache, self.attention.block_q, self.tokens, self.seqs, pieces)

    def rope_positions(self) -> torch.Tensor:
        """[3, 1, T]: M-RoPE's temporal, height and width rows (text and audio: the token's position in all three)."""
        return self.rope.view(3, 1, -1)

    # transformers' attention layers call `update`; the rest of the Cache API is unused (no mask is built
    # for a custom attention function). Never compiled: `layer_idx` picks a Python list item, which would
    # specialise a compiled decoder layer once per layer.
    @torch.compiler.disable
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states [1, Hkv, T, D] -> written at each token's (page, offset); the whole buffers back."""
        keys, values = self.cache.keys[layer_idx], self.cache.values[layer_idx]
        keys[self.token_page, :, self.token_offset] = key_states[0].transpose(0, 1)
        values[self.token_page, :, self.token_offset] = value_states[0].transpose(0, 1)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class ReferenceAttention:
    """Each sequence's queries over its slot's keys gathered from its pages, in float32; needs the host's pieces."""

    block_q = 0

    # never compiled: it reads the cache's host page table, which would guard a compiled layer on an array
    @torch.compiler.disable
    def __call__(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: PackedBatch,
                 scale: float) -> torch.Tensor:
        assert batch.pieces is not None, "reference attention runs eagerly"
        out = torch.zeros_like(query)
        group = query.shape[1] // keys.shape[1]
        q0 = 0
        for piece in batch.pieces:
            end = piece.start + piece.length
            q = query[q0 : q0 + piece.length].float().transpose(0, 1)  # [Hq, n, D]
            positions = np.arange(end)
            pages = torch.from_numpy(batch.cache.locate(np.full(end, piece.slot), positions)).to(keys.device)
            offsets = torch.from_numpy(positions % keys.shape[2]).to(keys.device)
            k = keys[pages, :, offsets].float().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, end, D]
            v = values[pages, :, offsets].float().transpose(0, 1).repeat_interleave(group, dim=0)
            scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [Hq, n, end]
            causal = torch.arange(end)[None, :] > (piece.start + torch.arange(piece.length))[:, None]
            scores.masked_fill_(causal.to(scores.device), float("-inf"))
            out[q0 : q0 + piece.length] = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).to(query.dtype)
            q0 += piece.length
        return out


def packed_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: query [1, Hq, T, D] -> ([1, T, Hq, D], None)."""
    batch: PackedBatch = kwargs["packed"]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return batch.attention(query[0].transpose(0, 1), key, value, batch, scale).unsqueeze(0), None


def use_packed_attention(model: Any) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
    model.config._attn_implementation = PACKED_ATTENTION


def _layout(cache: SlotKVCache, block_q: int, tokens: int, seqs: int, pieces: list[Piece]) -> np.ndarray:
    used = sum(p.length for p in pieces)
    assert used <= tokens and len(pieces) <= seqs, (used, tokens, len(pieces), seqs)
    for p in pieces:
        assert p.start + p.length <= cache.max_len, (p, cache.max_len)
        # a slot's pages come as it is written (the Thinker's stage reserves a reply's ahead)
        if not cache.reserve(p.slot, p.start + p.length):
            raise RuntimeError(f"the KV cache's {cache.num_pages} pages are all held: slot {p.slot} cannot grow "
                               f"to {p.start + p.length} positions")
    lengths = np.array([p.length for p in pieces], dtype=np.int64)
    q0 = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if pieces else lengths
    pad_tokens, pad_seqs = tokens - used, seqs - len(pieces)
    starts = np.array([p.start for p in pieces], dtype=np.int64)
    token_pos = np.concatenate([np.arange(used) - np.repeat(q0 - starts, lengths), np.zeros(pad_tokens, np.int64)])
    slots = np.array([p.slot for p in pieces], dtype=np.int64)
    token_page = np.concatenate([cache.locate(np.repeat(slots, lengths), token_pos[:used]),
                                 np.full(pad_tokens, cache.scratch_page)])
    fill = np.zeros(pad_seqs, dtype=np.int64)
    last = np.concatenate([np.maximum(q0 + lengths - 1, 0), fill])
    parts = [token_page, token_pos % cache.page_size, token_pos, np.concatenate([starts, fill]),
             np.concatenate([q0, fill]), np.concatenate([lengths, fill]), last]
    if block_q:
        parts += [np.asarray(table, dtype=np.int64) for table in block_tables(lengths.tolist(), block_q, tokens, seqs)]
    rope = np.broadcast_to(token_pos, (3, tokens)).copy()
    for p, q in zip(pieces, q0.tolist(), strict=True):
        if p.rope is not None:
            rope[:, q : q + p.length] = p.rope
    parts += [rope.reshape(-1), cache.page_table(slots, pad_to=seqs).reshape(-1)]
    return np.concatenate([np.pad(np.asarray(part, dtype=np.int64), (0, _aligned(part.size) - part.size))
                           for part in parts])


# Triton compiles a kernel once per alignment of its pointer arguments (16 bytes or not): with every part
# of `meta` starting on 16 bytes, an eager step of any size runs the variant compiled at start-up.
_ALIGN = 16 // 8  # int64s


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _part_sizes(tokens: int, seqs: int, block_q: int, pages_per_slot: int) -> list[int]:
    """The lengths of `meta`'s parts, in order (each stored from a 16-byte boundary)."""
    small, blocks = (seqs, num_blocks(tokens, seqs, block_q)) if block_q else (0, 0)
    return [tokens, tokens, tokens, seqs, seqs, seqs, seqs, small, blocks, blocks, 3 * tokens, seqs * pages_per_slot]
