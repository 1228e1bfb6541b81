"""The Thinker's packed-step scheduler (engine/omni/stages/thinker.py) over random arrivals, with a fake runner.

A fake runner stands in for the model: it records every step's rows and answers logits that make one token
win, so the real stage, `PrefixCache` and `FirstPacketPolicy` decide everything that is checked here: who has a row in each step, how many tokens a step carries,
which prompts pass which, how long a prompt waits, and where pieces end around audio clips.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

import pytest
import torch

from engine.handoff import AdmittedRequest, StageFailed
from engine.metrics import EngineMetrics
from engine.omni.runners.audio_encoder import DENSE_CHUNKS
from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.thinker import RowOut, StepRow
from engine.omni.stages.policy import FirstPacketPolicy
from engine.omni.stages.thinker import ThinkerStage
from engine.positions import placeholder_spans
from engine.profile import ChunkConfig, FirstPacketConfig, ThinkerConfig

AUDIO = 3  # the audio placeholder id
EOS = 2
REPLY_TOKEN = 7  # what every reply says (its length is its max_tokens)
VOCAB = 64
HIDDEN = 4
MAX_BATCH = 16
STEP_TOKENS = 256
SMALL_STEP_TOKENS = MAX_BATCH + 64  # the least the profile allows: room for pieces beside every reply's row


class FakeTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


class FakeRunner:
    """The runner's interface without a model: every row's logits make `REPLY_TOKEN` win."""

    def __init__(self, max_batch: int, max_len: int, pages: int | None = None) -> None:
        self.kv = SlotKVCache(num_layers=1, num_slots=max_batch, num_kv_heads=1, head_dim=1, max_len=max_len,
                              dtype=torch.float32, device="cpu", num_pages=pages, page_size=64)
        self.audio_token_id = AUDIO
        self.device = torch.device("cpu")
        self.steps: list[list[StepRow]] = []

    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(token_ids), HIDDEN)

    def audio_chunks(self, clip: torch.Tensor) -> int:
        return clip.shape[-1]  # a frame of these features is a chunk

    def step(self, rows: list[StepRow]) -> list[RowOut]:
        self.steps.append(list(rows))
        logits = torch.zeros(VOCAB)
        logits[REPLY_TOKEN] = 1.0
        return [RowOut(logits, torch.zeros(len(r.token_ids), HIDDEN), torch.zeros(len(r.token_ids), HIDDEN))
                for r in rows]


@dataclass
class Prompt:
    """A prompt of random tokens with runs of audio placeholders, one per clip."""

    request_id: str
    token_ids: list[int]
    clips: int
    max_tokens: int

    def admitted(self, want_audio: bool) -> AdmittedRequest:
        # each clip's features name its index; its key (a negative digest) is unique to this prompt
        features = [torch.full((128, 2), float(i)) for i in range(self.clips)]
        keys = [-(1000 * len(self.request_id) + sum(map(ord, self.request_id)) * 10 + i + 1) for i in range(self.clips)]
        return AdmittedRequest(self.request_id, self.token_ids, features, self.token_ids.count(AUDIO), keys,
                               want_audio, "ethan", self.max_tokens, 0.0, 1.0, 0, None)


def random_prompt(rng: random.Random, request_id: str, audio: bool) -> Prompt:
    ids: list[int] = [rng.randrange(10, VOCAB) for _ in range(rng.randrange(1, 40))]
    clips = rng.randrange(0, 3) if audio else 0
    for _ in range(clips):
        ids += [AUDIO] * rng.randrange(20, 150) + [rng.randrange(10, VOCAB) for _ in range(rng.randrange(1, 60))]
    return Prompt(request_id, ids, clips, rng.randrange(1, 12))


@dataclass
class Run:
    """What one schedule did, step by step."""

    stage: ThinkerStage
    runner: FakeRunner
    running_before: list[set[int]] = field(default_factory=list)  # per runner step, the running replies' slots
    pending_before: list[bool] = field(default_factory=list)  # per runner step, a prompt was waiting or partial
    batches: list[list[str]] = field(default_factory=list)  # per runner step, its rows' requests (`last_batch`)
    arrived: dict[str, int] = field(default_factory=dict)  # request -> stage step at which it arrived
    began: dict[str, int] = field(default_factory=dict)  # request -> stage step at which its reply began
    backlog: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # at arrival: tokens, clips, prompts ahead
    prompts: dict[str, Prompt] = field(default_factory=dict)


def make_stage(max_batch: int = MAX_BATCH, max_step_tokens: int = STEP_TOKENS,
               pages: int | None = None) -> tuple[ThinkerStage, FakeRunner]:
    """A stage that never paces its text (`text_lead` 0): it decodes whenever a reply runs; `pages`: its KV
    pool, in pages of 64 positions (by default every slot's 1024)."""
    cfg = ThinkerConfig(max_batch=max_batch, max_model_len=1024, max_step_tokens=max_step_tokens)
    runner = FakeRunner(max_batch, max_len=1024, pages=pages)
    stage = ThinkerStage(runner, cfg, FakeTokenizer(), {EOS}, FirstPacketPolicy(FirstPacketConfig(0), ChunkConfig()),
                         inbox=None, to_talker=lambda _: None, report=lambda _: None,
                         metrics=EngineMetrics())  # type: ignore[arg-type]
    return stage, runner


@functools.cache
def simulate(seed: int, *, steps: int = 200, arrival: float = 0.3, audio: bool = True, small: bool = False) -> Run:
    """Random arrivals, one stage step per turn; `small`: steps of the least budget the profile allows."""
    rng = random.Random(seed)
    stage, runner = make_stage(max_step_tokens=SMALL_STEP_TOKENS if small else STEP_TOKENS)
    run = Run(stage, runner)
    n = 0
    for turn in range(steps):
        if turn < steps - 60 and rng.random() < arrival:  # the last turns drain what came
            prompt = random_prompt(rng, f"r{n}", audio)
            n += 1
            ahead = [*stage.partial, *stage.waiting]
            run.backlog[prompt.request_id] = (
                sum(s.prompt_len - s.position for s in ahead) + len(prompt.token_ids),
                sum(len(s.clips) for s in ahead) + prompt.clips, len(ahead) + 1)
            run.prompts[prompt.request_id] = prompt
            run.arrived[prompt.request_id] = turn
            stage.accept(prompt.admitted(want_audio=rng.random() < 0.7))
        if not stage.has_work():
            continue
        before = len(runner.steps)
        running = {s.slot for s in stage.running.values()}
        pending = bool(stage.partial or stage.waiting)
        stage.step()
        if len(runner.steps) > before:
            run.running_before.append(running)
            run.pending_before.append(pending)
            run.batches.append(list(stage.last_batch))
        for request_id in stage.running:
            run.began.setdefault(request_id, turn)
        for request_id in run.arrived:  # replies of one token begin and end in the same step
            if request_id not in run.began and not any(
                    s.job.request_id == request_id for s in [*stage.partial, *stage.waiting]):
                run.began[request_id] = turn
    return run


SEEDS = range(6)


def piece_rows(run: Run, i: int) -> list[tuple[Prompt, StepRow]]:
    """Step i's prompt pieces (the rows before the decode rows), each with its prompt."""
    rows = run.runner.steps[i]
    n = len(rows) - len(run.running_before[i])
    return [(run.prompts[r], row) for r, row in zip(run.batches[i][:n], rows[:n], strict=True)]


@pytest.mark.parametrize("seed", SEEDS)
def test_every_running_reply_has_a_row_in_every_step(seed: int) -> None:
    run = simulate(seed, small=seed % 2 == 1)
    assert any(run.pending_before), "no step had a prompt pending"
    assert any(p and r for p, r in zip(run.pending_before, run.running_before, strict=True))
    for i, rows in enumerate(run.runner.steps):
        decode = rows[len(rows) - len(run.running_before[i]):]
        assert {r.slot for r in decode} == run.running_before[i]
        assert all(len(r.token_ids) == 1 for r in decode)
        assert len({r.slot for r in rows}) == len(rows)  # one row per sequence


@pytest.mark.parametrize("seed", SEEDS)
def test_a_step_stays_within_its_budget(seed: int) -> None:
    """What holds exactly: the prompt pieces fill what the decode rows leave of `max_step_tokens`; only a piece
    that begins at a clip may run past what is left, to that clip's end, and it is the step's last piece."""
    run = simulate(seed, small=seed % 2 == 1)
    budget = run.stage.cfg.max_step_tokens
    full = 0
    for i, rows in enumerate(run.runner.steps):
        room = budget - len(run.running_before[i])
        pieces = piece_rows(run, i)
        for j, (prompt, row) in enumerate(pieces):
            taken = len(row.token_ids)
            if taken > room:  # a clip that begins the piece, whole, as the step's last piece
                assert (row.start, row.start + taken) in placeholder_spans(prompt.token_ids, AUDIO), (row.start, taken, room)
                assert j == len(pieces) - 1
            room -= taken
        total = sum(len(r.token_ids) for r in rows)
        assert total <= budget or room < 0
        full += total == budget
    assert len(run.runner.steps) > 20
    assert full > 0  # pieces do fill the budget


def overtakers(run: Run) -> list[str]:
    """Prompts that began their replies before some prompt that came earlier."""
    order = sorted(run.arrived, key=lambda r: int(r[1:]))
    return [later for i, later in enumerate(order)
            if any(run.began[later] < run.began[earlier] for earlier in order[:i])]


def whole_pieces(run: Run) -> dict[str, list[int]]:
    """Request -> the steps that took one of its prompts whole within half of what the decode rows left."""
    whole: dict[str, list[int]] = {}
    budget = run.stage.cfg.max_step_tokens
    for i in range(len(run.runner.steps)):
        share = (budget - len(run.running_before[i])) // 2
        for prompt, row in piece_rows(run, i):
            if row.start == 0 and len(row.token_ids) == len(prompt.token_ids) <= share:
                whole.setdefault(prompt.request_id, []).append(i)
    return whole


def test_prompts_of_one_length_begin_their_replies_in_the_order_they_came() -> None:
    """With nothing shorter to pass them, prompts under way are served first come first served."""
    for small in (False, True):
        stage, _ = make_stage(max_step_tokens=SMALL_STEP_TOKENS if small else STEP_TOKENS)
        rng = random.Random(3)
        began: list[str] = []
        for turn in range(300):
            if turn < 200 and rng.random() < 0.2:
                n = sum(1 for _ in began) + len(stage.partial) + len(stage.waiting)
                stage.accept(Prompt(f"r{n}", [rng.randrange(10, VOCAB) for _ in range(90)], 0,
                                    rng.randrange(1, 12)).admitted(False))
            if stage.has_work():
                stage.step()
            began += [r for r in stage.running if r not in began]
        assert len(began) > 30
        assert began == sorted(began, key=lambda r: int(r[1:]))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_prompt_passes_earlier_ones_only_by_finishing_within_half_a_step(seed: int) -> None:
    """Prompts with clips and without, random lengths: a prompt that begins its reply before one that came earlier
    went whole in one step, within half of the room its decode rows left; and some do pass."""
    passed = 0
    for small in (False, True):
        run = simulate(seed, small=small)
        whole = whole_pieces(run)
        for request_id in overtakers(run):
            assert request_id in whole, (small, request_id)
            passed += 1
    assert passed > 0


def test_a_short_prompt_passes_a_long_one_under_way() -> None:
    """A turn of 20 tokens arriving while another call's 600-token history is prefilled again begins its reply in
    the next step, and the long prompt still takes the rest of that step."""
    stage, runner = make_stage(max_step_tokens=SMALL_STEP_TOKENS)
    stage.accept(Prompt("long", [11] * 600, 0, 4).admitted(False))
    stage.step()
    stage.accept(Prompt("short", [12] * 20, 0, 4).admitted(False))
    stage.step()
    assert [(r.start, len(r.token_ids)) for r in runner.steps[1]] == [(0, 20), (SMALL_STEP_TOKENS, SMALL_STEP_TOKENS - 20)]
    assert list(stage.running) == ["short"]
    steps = 0
    while "long" not in stage.running:
        stage.step()
        steps += 1
    assert steps <= math.ceil((600 - 140) / (SMALL_STEP_TOKENS - 1))  # a row for the short reply, at most


def test_a_prompt_cut_before_a_clip_ends_the_step() -> None:
    """A's piece stops where its clip begins (40 tokens, its clip of 80 would not fit): nothing goes behind it, so C,
    which came after A, waits; B, which finishes within half of the room, goes first. A's clip goes whole next."""
    stage, runner = make_stage(max_step_tokens=100)
    a = Prompt("a", [11] * 40 + [AUDIO] * 80 + [12], 1, 4)
    b = Prompt("b", [13] * 20, 0, 4)
    c = Prompt("c", [14] * 60, 0, 4)
    for prompt in (a, b, c):
        stage.accept(prompt.admitted(False))
    stage.step()
    assert stage.last_batch == ["b", "a"]
    assert [(r.start, len(r.token_ids)) for r in runner.steps[0]] == [(0, 20), (0, 40)]
    assert list(stage.running) == ["b"]
    stage.step()
    assert stage.last_batch == ["a", "c", "b"]
    assert [(r.start, len(r.token_ids)) for r in runner.steps[1]] == [(40, 81), (0, 18), (20, 1)]
    assert list(stage.running) == ["b", "a"]
    stage.step()
    assert list(stage.running) == ["b", "a", "c"]


@pytest.mark.parametrize("seed", SEEDS)
def test_no_prompt_starves(seed: int) -> None:
    """Under steady arrivals every prompt begins its reply within a bound set by what was ahead of it when it
    came, whatever came after: prompts that pass it take at most half of what the decode rows leave of a step, so
    every step gives the first prompt under way at least the other half (32 tokens), finishes it, or stops it at a
    clip that a step takes whole."""
    run = simulate(seed, arrival=0.25, small=True, steps=300)
    assert len(run.began) == len(run.arrived) > 40
    for request_id, arrived in run.arrived.items():
        tokens, clips, prompts = run.backlog[request_id]
        bound = math.ceil(tokens / ((SMALL_STEP_TOKENS - MAX_BATCH) // 2)) + 2 * clips + prompts
        assert run.began[request_id] - arrived <= bound, (request_id, run.backlog[request_id])


@pytest.mark.parametrize("seed", SEEDS)
def test_a_piece_never_ends_inside_a_clip(seed: int) -> None:
    run = simulate(seed, small=seed % 2 == 1)
    clipped = 0
    for i in range(len(run.runner.steps)):
        for prompt, row in piece_rows(run, i):
            spans = placeholder_spans(prompt.token_ids, AUDIO)
            end = row.start + len(row.token_ids)
            assert not any(a < row.start < b or a < end < b for a, b in spans), (row.start, end, spans)
            inside = [k for k, (a, _) in enumerate(spans) if row.start <= a < end]
            # each clip's features travel with the piece that holds its placeholders, in order
            assert [int(f[0, 0]) for f in row.audio] == inside
            clipped += bool(inside)
    assert clipped > 5


def test_only_the_first_piece_runs_past_the_room() -> None:
    """A clip that begins the step's first piece goes whole (the prompt must progress); a later piece stops
    before its clip, so a step carries more than its room only by its first piece's clip."""
    stage, runner = make_stage(max_step_tokens=SMALL_STEP_TOKENS)
    a = Prompt("a", [11] * 10 + [AUDIO] * 100 + [12] * 20 + [AUDIO] * 100 + [13], 2, 4)
    b = Prompt("b", [14] * 10 + [AUDIO] * 300 + [15], 1, 4)
    stage.accept(a.admitted(False))
    stage.accept(b.admitted(False))
    for _ in range(8):
        stage.step()
    pieces = [[(r.start, len(r.token_ids)) for r in rows] for rows in runner.steps]
    assert pieces[:3] == [[(0, 10)], [(10, 100)], [(110, 20)]]
    for step in pieces:
        assert sum(n for _, n in step[1:]) <= SMALL_STEP_TOKENS, step  # past the first piece, the room holds
    assert (10, 300) in [piece for step in pieces for piece in step[:1]]  # B's clip, whole, first in its step


def test_a_step_holds_no_more_audio_than_the_dense_tower_takes() -> None:
    """A history of many clips prefilled again goes in steps of at most `DENSE_CHUNKS` chunks of audio (the
    tower's graphed layout), whatever the token room; a single clip larger than that goes whole, alone."""
    stage, runner = make_stage(max_step_tokens=4096)
    widths = [30, 30, 30, 10, 100, 5]  # chunks per clip
    ids: list[int] = []
    for _ in widths:
        ids += [11] * 5 + [AUDIO] * 20
    ids += [12]
    features = [torch.full((128, w), float(i)) for i, w in enumerate(widths)]
    keys = [-(i + 1) for i in range(len(widths))]
    stage.accept(AdmittedRequest("a", ids, features, ids.count(AUDIO), keys, False, "ethan", 4, 0.0, 1.0, 0, None))
    for _ in range(6):
        stage.step()
    per_step = [[int(f[0, 0]) for row in rows for f in row.audio] for rows in runner.steps]
    assert [clips for clips in per_step if clips] == [[0, 1], [2, 3], [4], [5]]
    for clips in per_step:
        assert sum(widths[i] for i in clips) <= DENSE_CHUNKS or len(clips) == 1


class PoisonedRunner(FakeRunner):
    """A step fails whenever a prompt piece holds `POISON` (as a clip too long for the memory left would)."""

    def step(self, rows: list[StepRow]) -> list[RowOut]:
        if any(POISON in r.token_ids for r in rows):
            raise torch.OutOfMemoryError("no room for that clip")
        return super().step(rows)


POISON = 9


def test_a_prompt_that_fails_its_step_fails_alone() -> None:
    """The speaking replies beside a failing prompt piece take their step without it: only its request fails."""
    cfg = ThinkerConfig(max_batch=MAX_BATCH, max_model_len=1024, max_step_tokens=STEP_TOKENS)
    runner = PoisonedRunner(MAX_BATCH, max_len=1024)
    reports: list[object] = []
    stage = ThinkerStage(runner, cfg, FakeTokenizer(), {EOS}, FirstPacketPolicy(FirstPacketConfig(0), ChunkConfig()),
                         inbox=None, to_talker=lambda _: None, report=reports.append,
                         metrics=EngineMetrics())  # type: ignore[arg-type]
    for name in ("a", "b"):
        stage.accept(Prompt(name, [11, 12, 13], 0, 10).admitted(False))
    stage._step_safely()
    assert list(stage.running) == ["a", "b"]
    stage.accept(Prompt("bad", [14, POISON, 15], 0, 10).admitted(False))
    stage._step_safely()
    failed = [r for r in reports if isinstance(r, StageFailed)]
    assert [r.request_id for r in failed] == ["bad"] and "OutOfMemoryError" in failed[0].reason
    assert list(stage.running) == ["a", "b"] and not stage.partial and not stage.waiting
    assert [len(s.generated) for s in stage.running.values()] == [2, 2]  # the replies stepped all the same
    assert len(runner.steps[-1]) == 2


def test_a_short_kv_pool_makes_prompts_wait_for_pages_never_fail() -> None:
    """A pool of 16 pages (one sequence's 1024 positions) among 16 slots: each prompt of 100 tokens and its
    reply of 20 take 2 pages, so at most 8 run at once; the rest wait for pages, in order, and all finish."""
    stage, runner = make_stage(pages=16)
    rng = random.Random(1)
    prompts = [Prompt(f"r{i}", [rng.randrange(10, VOCAB) for _ in range(100)], 0, 20) for i in range(20)]
    for prompt in prompts:
        stage.accept(prompt.admitted(want_audio=False))
    began: list[str] = []
    for _ in range(500):
        if not stage.has_work():
            break
        stage.step()
        held = sum(runner.kv.capacity(s) for s in range(runner.kv.num_slots)) // 64
        assert held <= 16 and len(stage.running) + len(stage.partial) <= 8
        began += [r for r in stage.running if r not in began]
    assert began == [p.request_id for p in prompts]  # first come, first served
    assert not stage.running and not stage.waiting and not stage.partial
    # finished replies keep their prefixes in the pages they used, nothing more
    assert all(runner.kv.capacity(e.slot) == 128 for e in stage.cache.entries.values())


def test_a_prompt_ended_before_its_reply_keeps_what_its_slot_holds() -> None:
    """A conversation's next turn takes its cached prefix when it starts; cancelled after one piece, the prefix and
    that piece stay for the turn after it, which prefills only the rest."""
    stage, _ = make_stage(max_step_tokens=100)
    rng = random.Random(5)
    first = [rng.randrange(10, VOCAB) for _ in range(150)]
    stage.accept(Prompt("a", first, 0, 2).admitted(False))
    while stage.has_work():
        stage.step()
    second = first + [rng.randrange(10, VOCAB) for _ in range(300)]
    stage.accept(Prompt("b", second, 0, 2).admitted(False))
    stage.step()
    (b,) = stage.partial
    assert (b.cached, b.position) == (150, 250)  # a's prompt, then one piece
    stage.release("b")  # cancelled: the user spoke again
    assert not stage.partial and not stage.waiting
    stage.accept(Prompt("c", second + [11] * 10, 0, 2).admitted(False))
    stage.step()
    (c,) = stage.partial
    assert c.cached == 250
