"""Audio features and image pixels cross to the engine's process once (engine/remote/media.py): a server process
leaves out what it sent lately, the engine fills it in from what it holds, and asks for a request whole when it
let one go (tests/unit/test_engine_process.py: a spoken conversation with pictures through an engine process)."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import torch

from engine import AudioPart, EngineRequest, Failed, Finished, Message, SamplingParams, load_profile
from engine.handoff import AdmittedRequest, ImageInput
from engine.omni.weights.source import ModelSource
from engine.remote.media import HeldMedia, SentMedia
from engine.remote.messages import Submit

ONE = 128 * 10 * 4  # the bytes of the smallest clip's features below


def _admitted(keys: list[int], images: tuple[int, ...] = (), rid: str = "r") -> AdmittedRequest:
    features = [torch.full((128, 10 * (1 + k % 3)), float(k)) for k in keys]
    pictures = [ImageInput(torch.full((1, 64, 64, 3), -k, dtype=torch.uint8), (1, 4, 4), k) for k in images]
    return AdmittedRequest(rid, [1, 2, 3], features, 0, keys, False, "ethan", 4, 0.0, 1.0, 0, None, images=pictures)


def _equal(a: AdmittedRequest, b: AdmittedRequest) -> bool:
    return (all(torch.equal(x, y) for x, y in zip(a.audio_features, b.audio_features, strict=True))
            and all(torch.equal(x.pixels, y.pixels) for x, y in zip(a.images, b.images, strict=True)))


def test_clips_and_images_cross_once_and_are_filled_in_after() -> None:
    sent, held = SentMedia(), HeldMedia()
    first = sent.strip(_admitted([-1, -2], images=(-7,)))
    assert not sent.leaves_out(first)
    assert held.fill(first) is not None
    # a conversation's next turn, a clip twice in it
    second = sent.strip(_admitted([-1, -2, -3, -2], images=(-7, -8)))
    assert sent.leaves_out(second)
    assert [mel is None for mel in second.audio_features] == [True, True, False, True]
    assert [image.pixels is None for image in second.images] == [True, False]
    whole = held.fill(second)
    assert whole is not None and _equal(whole, _admitted([-1, -2, -3, -2], images=(-7, -8)))


def test_what_crosses_is_a_copy_inside_the_message() -> None:
    """A tensor would cross as a descriptor of shared memory, fetched from the sender in a round of handshakes:
    the wire holds arrays of their own, which multiprocessing pickles in the message itself."""
    request = _admitted([-5], images=(-6,))
    wire = SentMedia().strip(request)
    mel, pixels = wire.audio_features[0], wire.images[0].pixels
    assert isinstance(mel, np.ndarray) and isinstance(pixels, np.ndarray)
    assert not np.shares_memory(mel, request.audio_features[0].numpy())
    assert not np.shares_memory(pixels, request.images[0].pixels.numpy())
    message = ForkingPickler.dumps(Submit(wire))
    assert len(message) > mel.nbytes + pixels.nbytes
    whole = HeldMedia().fill(pickle.loads(message).request)
    assert whole is not None and _equal(whole, request)
    whole.images[0].pixels[0, 0, 0, 0] = 1  # the engine's own, writable


def test_an_engine_that_let_one_go_asks_for_the_request_whole() -> None:
    sent, held = SentMedia(), HeldMedia(budget=2 * ONE)  # room for two of the smallest clips
    for key in (-3, -6, -9):  # 128 x 10 each: -3 goes
        held.fill(sent.strip(_admitted([key])))
    again = sent.strip(_admitted([-3, -9]))
    assert held.fill(again) is None
    sent.forget(again)
    whole = held.fill(sent.strip(_admitted([-3, -9])))
    assert whole is not None and _equal(whole, _admitted([-3, -9]))


def test_the_server_side_forgets_its_oldest_past_its_budget() -> None:
    sent = SentMedia(budget=2 * ONE)
    for key in (-3, -6, -9):
        sent.strip(_admitted([key]))
    assert [mel is None for mel in sent.strip(_admitted([-3, -6, -9])).audio_features] == [False, True, True]
    sent.clear()
    assert not sent.leaves_out(sent.strip(_admitted([-6, -9])))


async def test_a_request_cancelled_while_asked_for_whole_ends(cache_dir: Path) -> None:
    """The engine's side: a request naming a clip it never got is not begun but asked for whole; a Cancel before
    it comes ends it with `aborted` (its stream must end), and a request that comes whole is begun."""
    from engine.omni.backend import OmniBackend
    from engine.remote.messages import Cancel, EngineSpec, Events, Resend
    from engine.remote.service import CoreService

    profile = load_profile(model="tiny", platform="cpu")
    core = OmniBackend(ModelSource.open("tiny", cache_dir=cache_dir), profile).load_core()
    await core.start()
    engine_end, server_end = multiprocessing.Pipe()
    service = CoreService(core, EngineSpec("tiny", profile, cache_dir), asyncio.get_running_loop())
    try:
        service.join(engine_end, read=False)
        admitted = await _admit(cache_dir, profile)
        named = SentMedia()
        named._sent.add(admitted.audio_keys[0], True, 0)  # believed sent, never sent
        service.on_messages(engine_end, [Submit(named.strip(admitted)), Cancel(admitted.request_id)])
        replies = await _drain(server_end, until=lambda m: isinstance(m, Events))
        assert [type(m) for m in replies] == [Resend, Events]
        assert replies[-1].events[0] == Failed(admitted.request_id, "aborted")
        service.on_messages(engine_end, [Submit(SentMedia().strip(admitted))])  # whole: begun, and ends
        events = await _drain(server_end, until=lambda m: isinstance(m, Events) and isinstance(m.events[-1], Finished))
        assert isinstance(events[-1], Events) and isinstance(events[-1].events[-1], Finished)
    finally:
        await service.stop()


async def _admit(cache_dir: Path, profile) -> AdmittedRequest:
    from engine.omni.backend import OmniBackend

    intake = OmniBackend(ModelSource.open("tiny", cache_dir=cache_dir), profile).intake(text_on_loop=True)
    clip = AudioPart(np.full(8_000, 0.05, dtype=np.float32))
    return await intake.admit(EngineRequest("spoken", (Message("user", (clip,)),), want_audio=False,
                                               sampling=SamplingParams(max_tokens=3)))


async def _drain(conn, until) -> list:
    """What the engine sent, less its state beats, up to the first message `until` accepts (30 s at most)."""
    from engine.remote.messages import Heartbeat, State

    got: list = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the engine's loop runs meanwhile: it sends what its requests made
        while conn.poll():
            message = conn.recv()
            if not isinstance(message, State | Heartbeat):
                got.append(message)
                if until(message):
                    return got
    raise AssertionError(f"timed out; got {got}")
