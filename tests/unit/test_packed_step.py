"""One packed Thinker step (engine/omni/runners/packed_batch.py) equals its parts: prompts and decode rows packed
together equal each run alone, a prompt in pieces of any size (decode rows riding) equals it whole, and a
step padded to a graph's bucket equals the exact step, its padding written only into the scratch page."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, WhisperFeatureExtractor

from engine import AudioPart, Message, TextPart
from engine.intake.prompt import Prompt, PromptBuilder
from engine.omni.runners.packed_batch import PackedBatch, Piece, query_blocks
from engine.omni.runners.thinker import RowOut, StepRow, ThinkerRunner
from engine.omni.weights.checkpoint import load_stage
from tests.unit.kv_views import kv_rows, scratch_rows, untouched


@pytest.fixture(scope="module")
def parts(tiny_checkpoint: Path) -> tuple[object, PromptBuilder]:
    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    return loaded, builder


def runner_of(loaded: object, max_batch: int = 6, max_len: int = 256, **kwargs: object) -> ThinkerRunner:
    return ThinkerRunner(loaded.model, loaded.config, max_batch=max_batch, max_len=max_len, **kwargs)  # type: ignore[attr-defined]


def whole(slot: int, prompt: Prompt) -> StepRow:
    return StepRow(slot, prompt.token_ids, audio=tuple(prompt.audio_features))


def tone(seconds: float, step: float) -> np.ndarray:
    return (0.2 * np.sin(np.arange(int(16_000 * seconds)) * step)).astype(np.float32)


def assert_close(got: RowOut, want: RowOut) -> None:
    assert got.embeds.shape == want.embeds.shape
    assert torch.allclose(got.logits, want.logits, atol=1e-4)
    assert torch.allclose(got.hidden, want.hidden, atol=1e-4)


def test_a_packed_step_equals_its_prefills_and_decodes_run_alone(parts: tuple[object, PromptBuilder]) -> None:
    loaded, builder = parts
    prompts = [
        builder.build((Message("user", (TextPart("short"),)),)),
        builder.build((Message("user", (AudioPart(tone(1.0, 0.07)), TextPart("and a longer question about it"))),)),
        builder.build((Message("user", (TextPart("a third prompt, that arrives while two replies run"),)),)),
    ]
    n0, n1 = len(prompts[0].token_ids), len(prompts[1].token_ids)
    with torch.inference_mode():
        runner = runner_of(loaded)
        # together: two prompts, then the third beside both replies' next tokens
        first = runner.step([whole(0, prompts[0]), whole(1, prompts[1])])
        mixed = runner.step([whole(2, prompts[2]), StepRow(0, [7], n0), StepRow(1, [9], n1)])
        # alone, in other slots: each prompt, each decode
        alone = [runner.step([whole(3 + b, p)])[0] for b, p in enumerate(prompts)]
        decodes = [runner.step([StepRow(3, [7], n0)])[0], runner.step([StepRow(4, [9], n1)])[0]]
        for got, want in zip([*first, mixed[0]], alone, strict=True):
            assert_close(got, want)
        for got, want in zip(mixed[1:], decodes, strict=True):
            assert_close(got, want)
        # every position written holds what running alone wrote
        for together, apart, n in ((0, 3, n0 + 1), (1, 4, n1 + 1), (2, 5, len(prompts[2].token_ids))):
            for a, b in zip(kv_rows(runner.kv, together, n), kv_rows(runner.kv, apart, n), strict=True):
                assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("piece", [1, 7, 64, 512])
def test_a_prompt_in_pieces_with_decode_rows_riding_equals_it_whole(parts: tuple[object, PromptBuilder],
                                                                      piece: int) -> None:
    loaded, builder = parts
    prompt = builder.build((Message("user", (TextPart("tell me a long story about the sea " * 4),)),))
    ids = prompt.token_ids
    other = builder.build((Message("user", (TextPart("hi"),)),)).token_ids
    with torch.inference_mode():
        runner = runner_of(loaded)
        one_shot = runner.step([StepRow(0, ids)])[0]
        runner.step([StepRow(1, other)])
        rows, position = [], len(other)
        for start in range(0, len(ids), piece):
            out = runner.step([StepRow(2, ids[start : start + piece], start), StepRow(1, [11], position)])
            rows.append(out[0])
            position += 1
        assert torch.allclose(rows[-1].logits, one_shot.logits, atol=1e-4)
        assert torch.allclose(torch.cat([r.hidden for r in rows]), one_shot.hidden, atol=1e-4)
        assert torch.allclose(runner.step([StepRow(2, [5], len(ids))])[0].logits,
                              runner.step([StepRow(0, [5], len(ids))])[0].logits, atol=1e-4)


def test_query_blocks_cover_every_query_once() -> None:
    assert query_blocks([1, 20, 0, 16], 16) == ([0, 1, 1, 3], [0, 0, 16, 0])
    assert query_blocks([3], 16, 3) == ([0, -1, -1], [0, 0, 0])
    with pytest.raises(AssertionError):
        query_blocks([40], 16, 2)


def test_a_step_padded_to_its_bucket_equals_the_exact_step(parts: tuple[object, PromptBuilder]) -> None:
    """What a graph replays (engine/omni/accel/cuda_graphs.py `GraphedPacked`), run eagerly with the kernel in
    Triton's interpreter: the step padded to 48 tokens and 6 sequences gives the same rows, and its padding
    writes only the scratch page."""
    pytest.importorskip("triton")
    from engine.omni.accel.packed_attention import KernelAttention

    loaded, builder = parts
    a = builder.build((Message("user", (TextPart("a prompt shorter than its bucket"),)),)).token_ids
    b = builder.build((Message("user", (TextPart("and another"),)),)).token_ids
    with torch.inference_mode():
        runner = runner_of(loaded, attention=KernelAttention())
        runner.step([StepRow(0, a)])
        exact = runner.step([StepRow(1, b), StepRow(0, [7], len(a))])
        runner.step([StepRow(2, a)])
        scratch = scratch_rows(runner.kv)
        pieces = [Piece(3, 0, len(b)), Piece(2, len(a), 1)]
        batch = PackedBatch.static(runner.kv, runner.attention, 48, runner.kv.num_slots)
        batch.meta.copy_(torch.from_numpy(batch.layout(pieces)))
        embeds = torch.randn(48, runner.text_model.embed_tokens.embedding_dim)  # junk past the real rows
        embeds[: len(b) + 1] = runner.embed(b + [7])
        logits, hidden = runner.packed_step(embeds, batch)
        assert torch.allclose(logits[0], exact[0].logits, atol=1e-4)
        assert torch.allclose(logits[1], exact[1].logits, atol=1e-4)
        assert torch.allclose(hidden[: len(b)], exact[0].hidden, atol=1e-4)
        for x, y in zip(kv_rows(runner.kv, 3, len(b)), kv_rows(runner.kv, 1, len(b)), strict=True):
            assert torch.allclose(x, y, atol=1e-5)
        assert any(not torch.equal(x, y) for x, y in
                   zip(scratch_rows(runner.kv), scratch, strict=True))
        # slots outside the step hold no pages, and no free page was written
        assert runner.kv.capacity(4) == runner.kv.capacity(5) == 0 and untouched(runner.kv)


def test_warming_the_eager_step_gives_its_slots_back(parts: tuple[object, PromptBuilder]) -> None:
    """Start-up's eager steps (the kernels of a step with images) leave the KV pool as they found it, and a
    prompt after them reads what a fresh runner's does."""
    loaded, builder = parts
    prompt = builder.build((Message("user", (TextPart("what the warm-up must not change"),)),))
    with torch.inference_mode():
        runner = runner_of(loaded, max_len=600)
        assert runner.warm_eager() == 2
        assert runner.kv.num_free_pages == runner.kv.num_pages
        assert_close(runner.step([whole(1, prompt)])[0], runner_of(loaded, max_len=600).step([whole(1, prompt)])[0])
        # a pool of one sequence's pages: the warm-up's pieces fit in it
        small = runner_of(loaded, max_len=512, kv_tokens=512)
        assert small.kv.num_pages == 2 and small.warm_eager() == 2 and small.kv.num_free_pages == 2
