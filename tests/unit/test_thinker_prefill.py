"""A batched, right-padded Thinker prefill equals prefilling each prompt alone (text and audio)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, WhisperFeatureExtractor

from engine import AudioPart, Message, TextPart
from engine.prompt import Prompt, PromptBuilder
from engine.runners.thinker import PrefillRow, ThinkerRunner
from engine.weights.checkpoint import load_stage


def row(slot: int, prompt: Prompt) -> PrefillRow:
    return PrefillRow(slot, prompt.token_ids, audio=tuple(prompt.audio_features))


def test_batched_prefill_equals_one_by_one(tiny_checkpoint: Path) -> None:
    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    tone = (0.2 * np.sin(np.arange(16_000) * 0.07)).astype(np.float32)
    prompts = [
        builder.build((Message("user", (TextPart("short"),)),)),
        builder.build((Message("user", (AudioPart(tone), TextPart("and a much longer question about it"))),)),
    ]
    with torch.inference_mode():
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=4, max_len=128)
        together = runner.prefill([row(b, p) for b, p in enumerate(prompts)], True)
        alone = [runner.prefill([row(2 + b, p)], True)[0] for b, p in enumerate(prompts)]
        for t, a in zip(together, alone, strict=True):
            assert t.embeds.shape == a.embeds.shape
            assert torch.allclose(t.logits, a.logits, atol=1e-4)
            assert torch.allclose(t.hidden, a.hidden, atol=1e-4)
        # and the caches they left decode alike
        lengths = [len(p.token_ids) for p in prompts]
        assert torch.allclose(runner.decode([0, 1], lengths, [5, 6]), runner.decode([2, 3], lengths, [5, 6]), atol=1e-4)


def test_bucket_padded_prefill_step_equals_eager_prefill(tiny_checkpoint: Path) -> None:
    """What a graphed prefill replays (engine/accel/cuda_graphs.py), run eagerly: prompts padded to
    their (prompts, length) bucket give the same logits, captured rows and decode as the plain prefill."""
    from engine.runners.kv_cache import SlotBatch

    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    group = [builder.build((Message("user", (TextPart(text),)),)).token_ids
             for text in ("a prompt shorter than its bucket", "and one more, a little longer than the first one")]
    with torch.inference_mode():
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=4, max_len=128)
        plain = runner.prefill([PrefillRow(b, ids) for b, ids in enumerate(group)], True)
        bucket = 64
        assert max(map(len, group)) < bucket
        padded = torch.randn(4, bucket, runner.text_model.embed_tokens.embedding_dim)  # junk past each prompt
        for b, ids in enumerate(group):
            padded[b, : len(ids)] = runner.embed(ids)
        scratch = runner.kv.scratch_slot  # two padding prompts, both written into the scratch slot
        view = SlotBatch(runner.kv, torch.tensor([2, 3, scratch, scratch]), torch.zeros(4, dtype=torch.long),
                         num_new=bucket, kv_len=bucket)
        logits, hidden = runner.prefill_step(padded, view, torch.tensor([len(group[0]) - 1, len(group[1]) - 1, 0, 0]))
        for b, ids in enumerate(group):
            assert torch.allclose(logits[b], plain[b].logits, atol=1e-4)
            assert torch.allclose(hidden[b, : len(ids)], plain[b].hidden, atol=1e-4)
        # the junk keys past each prompt are overwritten by decode before anything reads them
        positions = [len(ids) for ids in group]
        assert torch.allclose(runner.decode([0, 1], positions, [7, 9]), runner.decode([2, 3], positions, [7, 9]),
                              atol=1e-4)


def test_prefill_plan_splits_groups_into_captured_runs() -> None:
    from engine.accel.cuda_graphs import plan_prefill

    one_prompt = [(1, 32, 32), (1, 64, 64)]
    assert plan_prefill(one_prompt, [20]) == [slice(0, 1)]
    assert plan_prefill(one_prompt, [20, 30]) is None  # a group runs as one eager forward
    assert plan_prefill(one_prompt, [65]) is None  # longer than every bucket
    groups = one_prompt + [(2, 32, 32), (4, 32, 32), (2, 64, 64)]
    assert plan_prefill(groups, [20, 30, 5]) == [slice(0, 4)]
    assert plan_prefill(groups, [20, 40, 5]) == [slice(0, 2), slice(2, 4)]  # at 64 tokens, two prompts a replay
    assert plan_prefill(groups, [3] * 9) == [slice(0, 4), slice(4, 8), slice(8, 12)]


def test_extend_plan_reaches_past_each_rows_prefix() -> None:
    """Rows that continue a cached prefix replay a graph that attends over at least start + padded length."""
    from engine.accel.cuda_graphs import plan_prefill, prefill_bucket

    shapes = [(b, n, k) for b in (1, 2) for n in (32, 64) for k in (128, 256)]
    assert prefill_bucket(shapes, 1, [20], [90]) == (1, 32, 128)
    assert prefill_bucket(shapes, 2, [20, 40], [10, 100]) == (2, 64, 256)  # 100 + 64 > 128
    assert plan_prefill(shapes, [20, 30, 5], [0, 50, 7]) == [slice(0, 2), slice(2, 4)]
    assert plan_prefill(shapes, [20], [240]) is None  # its padding would write past every graph's keys


def test_prefill_buckets_pad_little() -> None:
    """Buckets x1.5 apart in length and prompt count: a burst of 40 prompts of 44 tokens pads to
    48 x 48 (2304 rows), where buckets x2 apart would pad it to 64 x 64 (4096)."""
    from engine.accel.cuda_graphs import GROUP_TOKENS, PREFILL_BATCHES, PREFILL_LENGTHS, plan_prefill, prefill_bucket

    shapes = [(b, n, n) for b in PREFILL_BATCHES for n in PREFILL_LENGTHS if b == 1 or b * n <= GROUP_TOKENS]
    lengths = [44] * 40  # a burst of the bench's prompts
    assert plan_prefill(shapes, lengths) == [slice(0, 64)]
    assert prefill_bucket(shapes, 40, [44] * 40) == (48, 48, 48)
    assert prefill_bucket(shapes, 1, [100]) == (1, 128, 128) and prefill_bucket(shapes, 5, [20] * 5) == (6, 32, 32)


class EagerBuckets:
    """GraphedPrefill with each replay run eagerly (CUDA graphs need a GPU): the same plan, the same
    bucket inputs (`_PrefillBucket.load`), the captured step run on them."""

    def __init__(self, runner: ThinkerRunner, shapes: list[tuple[int, int, int]]) -> None:
        self.runner, self.shapes = runner, shapes

    def plan(self, lengths: list[int], starts: list[int] | None = None) -> list[slice] | None:
        from engine.accel.cuda_graphs import plan_prefill

        return plan_prefill(self.shapes, lengths, starts)

    def __call__(self, embeds: torch.Tensor, slots: list[int], lengths: list[int],
                 starts: list[int] | None = None) -> tuple[torch.Tensor, ...]:
        from engine.accel.cuda_graphs import _PrefillBucket, prefill_bucket
        from engine.runners.kv_cache import SlotBatch

        n, starts = embeds.shape[0], starts or [0] * embeds.shape[0]
        size, length, keys = prefill_bucket(self.shapes, n, lengths, starts)
        index = torch.zeros(size, dtype=torch.long)
        bucket = _PrefillBucket(None, torch.zeros(size, length, embeds.shape[-1]), index.clone(), index.clone(),
                                index.clone(), ())  # type: ignore[arg-type]
        bucket.load(embeds, slots, lengths, starts, self.runner.kv.scratch_slot)
        view = SlotBatch(self.runner.kv, bucket.slots, bucket.starts, num_new=length, kv_len=keys)
        return tuple(out[:n] for out in self.runner.prefill_step(bucket.embeds, view, bucket.last))


def test_a_group_replayed_in_runs_of_shorter_buckets_equals_eager(tiny_checkpoint: Path) -> None:
    """A group splits into runs of as many prompts as its longest row's bucket holds; a later run of
    short prompts replays a shorter bucket than the group is padded to (its rows arrive 40 wide for
    a 16-row bucket). On the H200 that copy failed and ended every request of the step."""
    from engine.runners.replay import StepGraphs

    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    generator = torch.Generator().manual_seed(0)
    group = [torch.randint(100, 1000, (n,), generator=generator).tolist() for n in (40, 14, 9)]
    shapes = [(1, 16, 16), (1, 64, 64), (2, 16, 16), (2, 64, 64)]  # 2 x 64 rows at most: runs [0:2], [2:3]
    with torch.inference_mode():
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=6, max_len=128)
        eager = runner.prefill([PrefillRow(s, ids) for s, ids in zip((0, 1, 2), group, strict=True)], True)
        runner.graphs = StepGraphs(prefill=EagerBuckets(runner, shapes))
        assert runner.graphs.prefill is not None and runner.graphs.prefill.plan([40, 14, 9]) == [slice(0, 2), slice(2, 4)]
        replayed = runner.prefill([PrefillRow(s, ids) for s, ids in zip((3, 4, 5), group, strict=True)], True)
        for r, e in zip(replayed, eager, strict=True):
            assert r.hidden is not None and e.hidden is not None and r.hidden.shape == e.hidden.shape
            assert torch.allclose(r.logits, e.logits, atol=1e-4)
            assert torch.allclose(r.hidden, e.hidden, atol=1e-4)
        positions = list(map(len, group))
        assert torch.allclose(runner.decode([0, 1, 2], positions, [7, 8, 9]), runner.decode([3, 4, 5], positions, [7, 8, 9]),
                              atol=1e-4)
