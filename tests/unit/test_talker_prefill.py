"""A batched, right-padded Talker prefill equals prefilling each prompt alone, and decodes alike after."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.runners.talker import TalkerRunner
from engine.weights.checkpoint import load_stage


def test_batched_talker_prefill_equals_one_by_one(tiny_checkpoint: Path) -> None:
    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, 64, generator=gen), max_batch=4, max_len=64)
        prompts = [torch.randn(n, 64, generator=gen) for n in (9, 21)]
        logits, hidden = runner.prefill([0, 1], prompts)
        for b, prompt in enumerate(prompts):
            alone_logits, alone_hidden = runner.prefill([2 + b], [prompt])
            assert torch.allclose(logits[b], alone_logits[0], atol=1e-4)
            assert torch.allclose(hidden[b], alone_hidden[0], atol=1e-4)
        step = torch.randn(2, 64, generator=gen)
        lengths = [p.shape[0] for p in prompts]
        together = runner.decode([0, 1], lengths, step)[0]
        alone = runner.decode([2, 3], lengths, step)[0]
        assert torch.allclose(together, alone, atol=1e-4)


def test_bucket_padded_prefill_step_equals_eager_prefill(tiny_checkpoint: Path) -> None:
    """What a graphed Talker prefill replays, run eagerly: padding to the bucket changes nothing."""
    from engine.runners.kv_cache import SlotBatch

    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, 64, generator=gen), max_batch=4, max_len=64)
        prompt = torch.randn(13, 64, generator=gen)
        logits, hidden = runner.prefill([0], [prompt])
        padded = torch.randn(1, 32, 64, generator=gen)
        padded[0, :13] = prompt
        view = SlotBatch(runner.kv, torch.tensor([1]), torch.tensor([0]), num_new=32, kv_len=32)
        step_logits, step_hidden = runner.prefill_step(padded, view, torch.tensor([12]))
        assert torch.allclose(step_logits, logits, atol=1e-4) and torch.allclose(step_hidden, hidden, atol=1e-4)
        step = torch.randn(1, 64, generator=gen)
        assert torch.allclose(runner.decode([0], [13], step)[0], runner.decode([1], [13], step)[0], atol=1e-4)


def test_repetition_history_on_the_device_follows_each_slots_reply(tiny_checkpoint: Path) -> None:
    """The runner's per-slot table of produced codes penalises exactly what a per-reply list would."""
    from engine.runners.sampler import penalise_seen

    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, 64, generator=gen), max_batch=4, max_len=64)
        vocab = runner.seen_codes.shape[1]
        histories: dict[int, list[int]] = {0: [], 2: [], 3: []}
        runner.forget_codes(list(histories))
        for step in range(6):
            if step == 3:  # slot 2's reply ends; a new one takes the slot and starts with no history
                runner.forget_codes([2])
                histories[2] = []
            slots = torch.tensor(list(histories))
            logits = torch.randn(len(histories), vocab, generator=gen) * 3
            expected_seen = torch.zeros(len(histories), vocab, dtype=torch.bool)
            for row, history in enumerate(histories.values()):
                expected_seen[row, history] = True
            assert torch.equal(runner.penalise_repeats(logits, slots, 1.3), penalise_seen(logits, expected_seen, 1.3))
            codes = torch.randint(0, 8, (len(histories),), generator=gen)  # few ids: repeats happen
            runner.remember_codes(slots, codes)
            for history, code in zip(histories.values(), codes.tolist(), strict=True):
                history.append(code)
        assert runner.seen_codes[1].sum() == 0  # a slot no reply held


def test_a_reply_does_not_end_before_its_first_frame(tiny_checkpoint: Path) -> None:
    """Codec EOS is the likeliest code: a reply with no frame yet takes the next best, one with frames ends."""
    from engine.handoff import Inbox
    from engine.metrics import EngineMetrics
    from engine.profile import TalkerConfig
    from engine.runners.sampler import RowSampling
    from engine.stages.talker import TalkerSeq, TalkerStage

    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(6)
    sent: list = []
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, 64, generator=gen), max_batch=4, max_len=64)
        stage = TalkerStage(runner, TalkerConfig(), Inbox(), sent.append, None, lambda _: None, EngineMetrics())
        greedy = RowSampling(0.0, 1.0, 0, seed=0)
        seqs = [TalkerSeq(prompt=None, sampling=greedy, code_sampling=greedy,  # type: ignore[arg-type]
                          slot=runner.kv.allocate(), frames=frames) for frames in (0, 3)]
        for seq, rid in zip(seqs, ("new", "speaking"), strict=True):
            seq.prompt = type("P", (), {"request_id": rid})()  # type: ignore[assignment]
            stage.running[rid] = seq
        vocab = runner.seen_codes.shape[1]
        logits = torch.zeros(2, vocab)
        logits[:, runner.codec_eos_id] = 10.0
        logits[:, 7] = 5.0
        stage._take_code0(seqs, logits, torch.zeros(2, 64))
    assert int(seqs[0].code0) == 7  # the new reply speaks
    assert stage._finished == ["speaking"] and "speaking" not in stage.running
    assert [frames.is_final for frames in sent] == [True]  # only the reply with frames ended


def test_prefill_plan_splits_groups_into_captured_runs() -> None:
    from engine.accel.cuda_graphs import plan_prefill

    one_prompt = [(1, 32), (1, 64)]
    assert plan_prefill(one_prompt, [20]) == [slice(0, 1)]
    assert plan_prefill(one_prompt, [20, 30]) is None  # a group runs as one eager forward
    assert plan_prefill(one_prompt, [65]) is None  # longer than every bucket
    groups = one_prompt + [(2, 32), (4, 32), (2, 64)]
    assert plan_prefill(groups, [20, 30, 5]) == [slice(0, 4)]
    assert plan_prefill(groups, [20, 40, 5]) == [slice(0, 2), slice(2, 4)]  # at 64 rows, two prompts a replay
    assert plan_prefill(groups, [3] * 9) == [slice(0, 4), slice(4, 8), slice(8, 12)]


def test_prefill_buckets_pad_little() -> None:
    """Buckets x1.5 apart in length and prompt count: a burst of 40 prompts of 44 rows pads to 48 x 48
    (2304 rows), where buckets x2 apart would pad it to 64 x 64 (4096)."""
    from engine.accel.cuda_graphs import GROUP_TOKENS, PREFILL_BATCHES, PREFILL_LENGTHS, plan_prefill, prefill_bucket

    shapes = [(b, n) for b in PREFILL_BATCHES for n in PREFILL_LENGTHS if b == 1 or b * n <= GROUP_TOKENS]
    assert plan_prefill(shapes, [44] * 40) == [slice(0, 64)]
    assert prefill_bucket(shapes, 40, [44] * 40) == (48, 48)
    assert prefill_bucket(shapes, 1, [100]) == (1, 128) and prefill_bucket(shapes, 5, [20] * 5) == (6, 32)
