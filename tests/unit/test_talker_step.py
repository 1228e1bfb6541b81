"""One packed Talker step (engine/omni/runners/talker.py) equals its parts: a prompt and decode rows packed together
equal each alone, a prompt in pieces of any size (decode rows riding) equals it whole, and a step padded to a
graph's bucket equals the exact step, its padding written only into the scratch page. And the stage's own
rules: the repetition history per slot, no codec EOS before a reply's first frame, replies waiting for the KV pool
in order, a turn whose few rows are all here passing a long history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.omni.runners.packed_batch import PackedBatch, Piece
from engine.omni.runners.talker import TalkerRow, TalkerRunner
from engine.omni.weights.checkpoint import load_stage
from tests.unit.kv_views import kv_rows, scratch_rows, untouched

WIDTH = 64  # the tiny Thinker's hidden size


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint: Path) -> object:
    return load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")


def runner_of(loaded: object, seed: int, **kwargs: object) -> TalkerRunner:
    gen = torch.Generator().manual_seed(seed)
    return TalkerRunner(loaded.model, loaded.config, torch.randn(3, WIDTH, generator=gen),  # type: ignore[attr-defined]
                        max_batch=6, max_len=128, **kwargs)


def assert_kv_equal(runner: TalkerRunner, slot: int, other: int, n: int) -> None:
    for x, y in zip(kv_rows(runner.kv, slot, n), kv_rows(runner.kv, other, n), strict=True):
        assert torch.allclose(x, y, atol=1e-5)


def test_a_packed_talker_step_equals_its_prefill_and_decode_run_alone(loaded: object) -> None:
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        runner = runner_of(loaded, 3)
        width = runner.codec_embedding.embedding_dim
        short, long = torch.randn(9, width, generator=gen), torch.randn(21, width, generator=gen)
        row = torch.randn(1, width, generator=gen)
        runner.step([TalkerRow(0, 0, short)])
        alone_prefill = runner.step([TalkerRow(1, 0, long)])
        alone_decode = runner.step([TalkerRow(0, 9, row)])
        runner.step([TalkerRow(2, 0, short)])
        logits, hidden = runner.step([TalkerRow(3, 0, long), TalkerRow(2, 9, row)])
        assert torch.allclose(logits[0], alone_prefill[0][0], atol=1e-4)
        assert torch.allclose(hidden[0], alone_prefill[1][0], atol=1e-4)
        assert torch.allclose(logits[1], alone_decode[0][0], atol=1e-4)
        assert torch.allclose(hidden[1], alone_decode[1][0], atol=1e-4)
        assert_kv_equal(runner, 3, 1, 21)
        assert_kv_equal(runner, 2, 0, 10)


@pytest.mark.parametrize("piece", [1, 7, 64, 70])
def test_a_prompt_in_pieces_with_a_decode_row_riding_equals_it_whole(loaded: object, piece: int) -> None:
    """How the stage prefills a long conversation's prompt under its step budget (user turns first, the
    assistant part once the first text token is here): the last piece's logits, and every key and value."""
    gen = torch.Generator().manual_seed(piece)
    with torch.inference_mode():
        runner = runner_of(loaded, 4)
        width = runner.codec_embedding.embedding_dim
        prompt, rider = torch.randn(70, width, generator=gen), torch.randn(5, width, generator=gen)
        whole = runner.step([TalkerRow(0, 0, prompt)])
        runner.step([TalkerRow(2, 0, rider)])
        for start in range(0, 70, piece):
            rows = prompt[start : start + piece]
            out = runner.step([TalkerRow(1, start, rows), TalkerRow(2, 5 + start // piece, rows[:1])])
        assert torch.allclose(out[0][0], whole[0][0], atol=1e-4)
        assert torch.allclose(out[1][0], whole[1][0], atol=1e-4)
        assert_kv_equal(runner, 1, 0, 70)


def test_a_step_padded_to_its_bucket_equals_the_exact_step(loaded: object) -> None:
    """What a graph replays (engine/omni/accel/cuda_graphs.py `GraphedPacked`), run eagerly with the kernel in
    Triton's interpreter: the step padded to 32 rows gives the same outputs, and its padding writes only the
    scratch page."""
    pytest.importorskip("triton")
    from engine.omni.accel.packed_attention import KernelAttention

    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        runner = runner_of(loaded, 5, attention=KernelAttention())
        width = runner.codec_embedding.embedding_dim
        prompt, row, first = (torch.randn(n, width, generator=gen) for n in (13, 1, 6))
        runner.step([TalkerRow(0, 0, first)])
        exact = runner.step([TalkerRow(1, 0, prompt), TalkerRow(0, 6, row)])
        runner.step([TalkerRow(2, 0, first)])
        scratch = scratch_rows(runner.kv)
        batch = PackedBatch.static(runner.kv, runner.attention, 32, runner.kv.num_slots)
        batch.meta.copy_(torch.from_numpy(batch.layout([Piece(3, 0, 13), Piece(2, 6, 1)])))
        embeds = torch.randn(32, width, generator=gen)  # junk past the real rows
        embeds[:14] = torch.cat([prompt, row])
        logits, hidden = runner.packed_step(embeds, batch)
        assert torch.allclose(logits[:2], exact[0], atol=1e-4) and torch.allclose(hidden[:2], exact[1], atol=1e-4)
        assert_kv_equal(runner, 3, 1, 13)
        assert any(not torch.equal(x, y) for x, y in
                   zip(scratch_rows(runner.kv), scratch, strict=True))
        # slots outside the step hold no pages, and no free page was written
        assert runner.kv.capacity(4) == runner.kv.capacity(5) == 0 and untouched(runner.kv)


def test_repetition_history_on_the_device_follows_each_slots_reply(loaded: object) -> None:
    """The runner's per-slot table of produced codes penalises exactly what a per-reply list would."""
    from engine.omni.runners.sampler import penalise_seen

    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        runner = runner_of(loaded, 5)
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


def test_a_reply_does_not_end_before_its_first_frame(loaded: object) -> None:
    """Codec EOS is the likeliest code: a reply with no frame yet takes the next best, one with frames ends."""
    from engine.handoff import Inbox, ThinkerPrompt
    from engine.metrics import EngineMetrics
    from engine.omni.runners.sampler import RowSampling
    from engine.omni.stages.talker import TalkerSeq, TalkerStage
    from engine.profile import TalkerConfig

    sent: list = []
    with torch.inference_mode():
        runner = runner_of(loaded, 6)
        stage = TalkerStage(runner, TalkerConfig(), Inbox(), sent.append, None, lambda _: None, EngineMetrics())
        greedy = RowSampling(0.0, 1.0, 0, seed=0)
        seqs = [TalkerSeq(prompt=None, sampling=greedy, code_sampling=greedy,  # type: ignore[arg-type]
                          slot=runner.kv.allocate(), frames=frames) for frames in (0, 3)]
        for seq, rid in zip(seqs, ("new", "speaking"), strict=True):
            seq.prompt = ThinkerPrompt(rid, [], "ethan", None, np.zeros(0, dtype=np.int64))
            stage.running[rid] = seq
        vocab = runner.seen_codes.shape[1]
        logits = torch.zeros(2, vocab)
        logits[:, runner.codec_eos_id] = 10.0
        logits[:, 7] = 5.0
        stage._next_frames(seqs, logits, torch.zeros(2, runner.codec_embedding.embedding_dim))
    assert int(seqs[0].next_codes[0]) == 7  # the new reply speaks
    assert stage._finished == ["speaking"] and "speaking" not in stage.running
    assert [frames.is_final for frames in sent] == [True]  # only the reply with frames ended


def arrive(stage: Any, gen: torch.Generator, rid: str, user_tokens: int, first_text: bool = False) -> None:
    """A one-turn prompt of `user_tokens` user tokens at the Talker: its Thinker rows, and its first text token."""
    from engine.handoff import PromptRows, ThinkerPrompt, ThinkerToken

    config = stage.runner.config
    ids = [config.im_start_token_id, config.user_token_id, *[9] * user_tokens,
           config.im_start_token_id, config.assistant_token_id, 198]
    stage.accept(ThinkerPrompt(rid, ids, "ethan", 0, np.asarray(ids, dtype=np.int64)))
    stage.accept(PromptRows(rid, torch.randn(len(ids), WIDTH, generator=gen), torch.randn(len(ids), WIDTH, generator=gen)))
    if first_text:
        stage.accept(ThinkerToken(rid, 11, torch.randn(WIDTH, generator=gen)))


def test_replies_wait_for_the_talker_kv_pool_first_come_first_served(loaded: object) -> None:
    """A Talker pool of 16 pages of 8 rows: a reply starts when its prompt's rows and `max_frames` can be
    reserved; a short prompt behind a long one that waits for pages waits too, and they start in order."""
    from engine.handoff import Inbox
    from engine.metrics import EngineMetrics
    from engine.omni.runners.kv_cache import SlotKVCache
    from engine.omni.stages.talker import TalkerStage
    from engine.profile import TalkerConfig

    gen = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        runner = runner_of(loaded, 7)
        text = runner.config.talker_config.text_config
        runner.kv = SlotKVCache(num_layers=text.num_hidden_layers, num_slots=6, num_kv_heads=text.num_key_value_heads,
                                head_dim=text.head_dim, max_len=128, dtype=torch.float32, device="cpu",
                                num_pages=16, page_size=8)
        stage = TalkerStage(runner, TalkerConfig(max_frames=8), Inbox(), lambda _: None, None, lambda _: None,
                            EngineMetrics())
        speaking = runner.kv.allocate()
        assert runner.kv.reserve(speaking, 16)  # another reply holds 2 pages

        arrive(stage, gen, "long", 98)  # 100 user rows + 9 + 8 frames: 15 pages, 14 free
        arrive(stage, gen, "short", 20)  # 22 + 9 + 8: 5 pages, which are free, but it came second
        assert not stage.has_work()
        runner.kv.free(speaking)
        assert stage.has_work()
        stage.step()  # the long prompt's user rows (its first text token has not come)
        assert stage.last_batch == ["long"] and stage.pending["long"].position == 100
        assert runner.kv.held[stage.pending["long"].slot] == 15 and stage.pending["short"].slot < 0
        stage.release("long")  # its user rows are kept, 13 pages, and given up for the next reply
        assert runner.kv.num_free_pages == 3 and list(stage.cache.entries)
        stage.step()
        assert stage.last_batch == ["short"] and not stage.cache.entries and runner.kv.num_free_pages == 11


def test_a_reply_whose_few_rows_are_all_here_passes_a_long_history(loaded: object) -> None:
    """Another call's history of 200 user rows, still without its first text token, came first; a turn whose
    prompt (12 user rows, its assistant part) is all here fits half of the step's room: it goes whole and speaks
    from this step, and the history takes the rest of the room."""
    from engine.handoff import Inbox
    from engine.metrics import EngineMetrics
    from engine.omni.runners.kv_cache import SlotKVCache
    from engine.omni.stages.talker import TalkerStage
    from engine.profile import TalkerConfig

    gen = torch.Generator().manual_seed(8)
    with torch.inference_mode():
        runner = runner_of(loaded, 8)
        text = runner.config.talker_config.text_config
        runner.kv = SlotKVCache(num_layers=text.num_hidden_layers, num_slots=6, num_kv_heads=text.num_key_value_heads,
                                head_dim=text.head_dim, max_len=512, dtype=torch.float32, device="cpu", page_size=8)
        room = 16 + 64  # the least `max_step_tokens` allows for 16 replies
        stage = TalkerStage(runner, TalkerConfig(max_batch=16, max_step_tokens=room, max_frames=8), Inbox(),
                            lambda _: None, None, lambda _: None, EngineMetrics())

        arrive(stage, gen, "history", 198)
        arrive(stage, gen, "turn", 10, first_text=True)
        stage.step()
        assert stage.last_batch == ["turn", "history"]
        assert list(stage.running) == ["turn"]  # its prompt is in, its first frame sampled
        turn_rows = stage.running["turn"].position
        assert turn_rows == 12 + 9 and stage.pending["history"].position == room - turn_rows
