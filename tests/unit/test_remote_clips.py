"""Clip features cross to the engine's process once (engine/remote/clips.py): a server process leaves out what it
sent lately, the engine fills it in from what it holds, and asks for a request whole when it let one go
(tests/unit/test_engine_process.py: a spoken conversation through an engine process)."""

from __future__ import annotations

import torch

from engine.handoff import AdmittedRequest
from engine.remote.clips import HeldClips, SentClips


def _admitted(keys: list[int], rid: str = "r") -> AdmittedRequest:
    features = [torch.full((128, 10 * (1 + k % 3)), float(k)) for k in keys]
    return AdmittedRequest(rid, [1, 2, 3], features, 0, keys, False, "ethan", 4, 0.0, 1.0, 0, None)


def test_a_clip_crosses_once_and_is_filled_in_after() -> None:
    sent, held = SentClips(), HeldClips()
    first = sent.strip(_admitted([1, 2]))
    assert all(mel is not None for mel in first.audio_features)
    assert held.fill(first) is not None
    second = sent.strip(_admitted([1, 2, 3, 2]))  # a conversation's next turn; a clip twice in it
    assert [mel is None for mel in second.audio_features] == [True, True, False, True]
    whole = held.fill(second)
    assert whole is not None
    for mel, key in zip(whole.audio_features, [1, 2, 3, 2], strict=True):
        assert torch.equal(mel, _admitted([key]).audio_features[0])


def test_what_crosses_is_a_copy() -> None:
    """Sending a tensor between processes moves it into shared memory (a descriptor held open): never the
    server process's own features."""
    request = _admitted([5])
    wire = SentClips().strip(request)
    assert wire.audio_features[0].data_ptr() != request.audio_features[0].data_ptr()


def test_an_engine_that_let_a_clip_go_asks_for_the_request_whole() -> None:
    sent, held = SentClips(), HeldClips(budget=2 * 128 * 10 * 4)  # room for two of the smallest clips
    held.fill(sent.strip(_admitted([3])))  # 128 x 10
    held.fill(sent.strip(_admitted([6])))  # 128 x 10
    held.fill(sent.strip(_admitted([9])))  # 128 x 10: clip 3 goes
    again = sent.strip(_admitted([3, 9]))
    assert held.fill(again) is None
    sent.forget(again.audio_keys)
    whole = held.fill(sent.strip(_admitted([3, 9])))
    assert whole is not None and torch.equal(whole.audio_features[0], _admitted([3]).audio_features[0])


def test_the_server_side_forgets_its_oldest_past_its_budget() -> None:
    one = 128 * 10 * 4
    sent = SentClips(budget=2 * one)
    for key in (3, 6, 9):
        sent.strip(_admitted([key]))
    assert [mel is None for mel in sent.strip(_admitted([3, 6, 9])).audio_features] == [False, True, True]
    sent.clear()
    assert all(mel is not None for mel in sent.strip(_admitted([6, 9])).audio_features)
