"""Token sampling for a batch whose rows each carry their own settings and seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class RowSampling:
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator


def sample(logits: torch.Tensor, rows: list[RowSampling]) -> torch.Tensor:
    """logits: [B, V] -> token ids [B]. Temperature 0 is greedy."""
    logits = logits.float()
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for b, row in enumerate(rows):
        row_logits = logits[b]
        if row.temperature <= 0:
            out[b] = row_logits.argmax()
            continue
        row_logits = row_logits / row.temperature
        if 0 < row.top_k < row_logits.shape[-1]:
            kth = torch.topk(row_logits, row.top_k).values[-1]
            row_logits = row_logits.masked_fill(row_logits < kth, float("-inf"))
        probs = torch.softmax(row_logits, dim=-1)
        if row.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Drop a token when the mass before it already reaches top_p (the first always stays).
            drop = sorted_probs.cumsum(-1) - sorted_probs >= row.top_p
            probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
        # Exponential-race sampling (argmax of p / Exp(1)) draws from `probs` with no host sync,
        # and the per-row generator keeps a seeded request's tokens independent of its batch.
        noise = torch.empty_like(probs).exponential_(1.0, generator=row.generator)
        out[b] = (probs / noise).argmax()
    return out


def apply_repetition_penalty(logits: torch.Tensor, history: list[list[int]], penalty: float) -> torch.Tensor:
    """CTRL-style penalty on ids each row already produced (as transformers applies it)."""
    if penalty == 1.0:
        return logits
    logits = logits.clone()
    for b, ids in enumerate(history):
        if not ids:
            continue
        idx = torch.tensor(ids, device=logits.device)
        seen = logits[b, idx]
        logits[b, idx] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
