"""The batched sampler: batch-invariant per seed, right distribution, top-k/top-p/greedy respected."""

from __future__ import annotations

import torch

from engine.omni.runners.sampler import RowSampling, penalise_seen, sample


def _logits(batch: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_a_row_draws_the_same_tokens_alone_or_in_a_batch() -> None:
    logits = _logits(4, 1000, 0)
    alone = [sample(logits[i : i + 1], [RowSampling(0.9, 0.95, 50, seed=100 + i)]) for i in range(4)]
    batched = sample(logits, [RowSampling(0.9, 0.95, 50, seed=100 + i) for i in range(4)])
    assert batched.tolist() == [int(t) for t in alone]


def test_the_draw_counter_moves_the_stream_on() -> None:
    logits = torch.zeros(1, 5000)
    row = RowSampling(1.0, 1.0, 0, seed=7)
    draws = [int(sample(logits, [row])) for _ in range(20)]
    assert row.draws == 20 and len(set(draws)) > 15
    again = RowSampling(1.0, 1.0, 0, seed=7)
    assert [int(sample(logits, [again])) for _ in range(20)] == draws


def test_frequencies_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].expand(4000, -1)
    rows = [RowSampling(1.0, 1.0, 0, seed=s) for s in range(4000)]
    counts = torch.bincount(sample(logits, rows), minlength=4).float() / 4000
    assert torch.allclose(counts, probs, atol=0.03), counts


def test_greedy_top_k_and_top_p() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]]).expand(500, -1)
    assert set(sample(logits, [RowSampling(0.0, 1.0, 0, seed=s) for s in range(500)]).tolist()) == {1}
    assert set(sample(logits, [RowSampling(5.0, 1.0, 2, seed=s) for s in range(500)]).tolist()) == {1, 3}
    # softmax(logits / 5) puts ~0.30 on id 1 and ~0.25 on id 3: top_p 0.5 keeps exactly those two
    assert set(sample(logits, [RowSampling(5.0, 0.5, 0, seed=s) for s in range(500)]).tolist()) == {1, 3}


def test_repetition_penalty_matches_transformers() -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = _logits(3, 50, 1)
    history = [[1, 2, 2], [], [49, 0]]
    seen = torch.zeros(3, 50, dtype=torch.bool)
    for b, h in enumerate(history):
        seen[b, h] = True
    ours = penalise_seen(logits, seen, 1.3)
    processor = RepetitionPenaltyLogitsProcessor(1.3)
    for b, h in enumerate(history):
        expected = processor(torch.tensor([h or [0]]), logits[b : b + 1].clone()) if h else logits[b : b + 1]
        assert torch.allclose(ours[b], expected[0])
