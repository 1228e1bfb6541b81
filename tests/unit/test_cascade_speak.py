"""What the assistant's voice says of a reply (engine/cascade/speak.py): its text, never its tool calls; the first
clause's first frames at once, and in all its clauses' audio."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from engine.api import AudioChunk
from engine.cascade.clauses import ClauseCutter
from engine.cascade.speak import SpeakStage, speakable
from engine.cascade.voice import PiperVoice
from engine.handoff import AudioFinished, Inbox, ThinkerDone, ThinkerPrompt, ThinkerToken
from engine.metrics import EngineMetrics

TOLERANCE = 1e-5  # a clause's pieces joined against it whole (tests/unit/test_cascade_vits_split.py)

REPLY = 'Sure, the lamp. <tool_call>\n{"name": "set_lamp", "arguments": {"on": true}}\n</tool_call>\nIt is on.'


def test_a_tool_call_is_never_spoken_however_the_text_arrives() -> None:
    said = [speakable(REPLY[:n]) for n in range(len(REPLY) + 1)]
    assert said[-1] == "Sure, the lamp. It is on."
    assert all(later.startswith(earlier) for earlier, later in zip(said, said[1:], strict=False))  # only grows
    assert not any("tool_call" in s or "set_lamp" in s for s in said)


def test_an_angle_bracket_that_opens_no_call_is_spoken() -> None:
    assert speakable("a < b") == "a < b" and speakable("ok <") == "ok "


class Pieces:
    """A tokenizer whose token i is the i-th piece of a text."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


@pytest.fixture(scope="module")
def voice() -> PiperVoice:
    return PiperVoice.load(threads=2)


def speaking(voice: PiperVoice, replies: dict[str, str]) -> tuple[SpeakStage, list[Any]]:
    """A speaking stage given each reply's whole text, 3 characters a token, as the Thinker stage sends it."""
    reports: list[Any] = []
    texts = list(replies.values())
    tokenizer = Pieces([t[at : at + 3] for t in texts for at in range(0, len(t), 3)])
    stage = SpeakStage(voice, tokenizer, Inbox(), reports.append, EngineMetrics(), torch.device("cpu"))
    token = 0
    for request_id, text in replies.items():
        stage.accept(ThinkerPrompt(request_id, [], "joe", SEED, np.zeros(0)))
        for _ in range(0, len(text), 3):
            stage.accept(ThinkerToken(request_id, token, torch.zeros(1)))
            token += 1
        stage.accept(ThinkerDone(request_id))
    return stage, reports


SEED = 5
ANSWER = "The capital of France is Paris. It is a big city with many old museums."


def test_a_replys_first_clause_goes_out_at_once_in_two_chunks_and_the_chunks_are_its_clauses(
        voice: PiperVoice) -> None:
    cutter = ClauseCutter()
    clauses = cutter.feed(ANSWER) + cutter.flush()
    assert clauses == ["The capital of France is Paris.", "It is a big city with many old museums."]
    stage, reports = speaking(voice, {"a": ANSWER})
    stage.step()
    (first,) = reports
    assert isinstance(first, AudioChunk) and first.sample_offset == 0 and not first.is_last
    np.testing.assert_array_equal(first.samples, next(voice.stream(clauses[0], seed=SEED)))
    while stage.has_work():
        stage.step()
    chunks = [r for r in reports if isinstance(r, AudioChunk) and r.samples.size]
    assert [c.samples.size for c in chunks[:2]] == [p.size for p in voice.stream(clauses[0], seed=SEED)]
    assert [c.sample_offset for c in chunks] == list(np.cumsum([0] + [c.samples.size for c in chunks[:-1]]))
    whole = [voice.synthesize(clause, seed=SEED + k) for k, clause in enumerate(clauses)]  # each clause one chunk
    assert len(chunks) == len(whole) + 1 and chunks[2].samples.size == whole[1].size
    joined, expected = np.concatenate([c.samples for c in chunks]), np.concatenate(whole)
    assert joined.size == expected.size and np.abs(joined - expected).max() <= TOLERANCE
    assert chunks[-1].is_last and isinstance(reports[-1], AudioFinished)


def test_a_reply_with_no_audio_yet_goes_before_the_rest_of_a_clause_begun(voice: PiperVoice) -> None:
    stage, reports = speaking(voice, {"a": ANSWER, "b": "Sure, I can help with that."})
    for _ in range(3):
        stage.step()
    chunks = [r for r in reports if isinstance(r, AudioChunk)]
    assert [(c.request_id, c.sample_offset > 0) for c in chunks] == [("a", False), ("b", False), ("a", True)]
