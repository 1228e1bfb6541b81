"""The Piper graph with its noise made inputs: the same graph as the original but for the noise, and a flow buffer
of any length long enough gives the same audio."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from engine.cascade import vits_noise
from engine.cascade.packages import PIPER_JOE
from engine.cascade.voice import _MODEL, PiperVoice

HELLO = "Hello, how are you today?"


def session(model: str | bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def ours() -> ort.InferenceSession:
    return session(vits_noise.with_noise_inputs(PIPER_JOE.path(_MODEL)).SerializeToString())


def graph_feed(text: str) -> dict[str, np.ndarray]:
    """The graph's inputs for one sentence, but its noise."""
    voice = PiperVoice.load(threads=2)
    (ids,) = voice.phoneme_ids(text)
    c = voice.config
    return {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([c.noise_scale, c.length_scale, c.noise_w], dtype=np.float32)}


@pytest.fixture(scope="module")
def feed() -> dict[str, np.ndarray]:
    return graph_feed(HELLO)


def test_the_noise_nodes_are_float_inputs(ours: ort.InferenceSession) -> None:
    inputs = {i.name: i for i in ours.get_inputs()}
    assert list(inputs) == ["input", "input_lengths", "scales", "noise_dp", "noise_flow"]
    for name in ("noise_dp", "noise_flow"):
        assert inputs[name].type == "tensor(float)" and inputs[name].shape == ["batch", "channels", "length"]


def test_with_no_noise_the_graph_is_the_original(ours: ort.InferenceSession, feed: dict[str, np.ndarray]) -> None:
    ids = feed["input"].shape[1]
    silent = {**feed, "scales": feed["scales"] * np.array([0, 1, 0], dtype=np.float32)}
    original = session(str(PIPER_JOE.path(_MODEL))).run(["output"], silent)[0]
    zero = {"noise_dp": np.zeros((1, 2, ids), np.float32), "noise_flow": np.zeros((1, 192, 8 * ids), np.float32)}
    np.testing.assert_array_equal(ours.run(["output"], silent | zero)[0], original)


def test_a_longer_flow_buffer_gives_the_same_audio(ours: ort.InferenceSession, feed: dict[str, np.ndarray]) -> None:
    ids = feed["input"].shape[1]
    short = ours.run(["output"], feed | vits_noise.draw(3, 0, ids, 4 * ids))[0]
    assert short.size // 256 <= 4 * ids  # the shorter buffer held every frame (256 samples each)
    np.testing.assert_array_equal(ours.run(["output"], feed | vits_noise.draw(3, 0, ids, 12 * ids))[0], short)


def test_draws_depend_on_the_seed_and_the_sentence_alone() -> None:
    first = vits_noise.draw(7, 1, ids=20, frames=50)
    assert first["noise_dp"].shape == (1, 2, 20) and first["noise_flow"].shape == (1, 192, 50)
    again = vits_noise.draw(7, 1, ids=20, frames=80)
    np.testing.assert_array_equal(again["noise_dp"], first["noise_dp"])
    np.testing.assert_array_equal(again["noise_flow"][..., :50], first["noise_flow"])
    assert not np.array_equal(vits_noise.draw(7, 2, ids=20, frames=50)["noise_dp"], first["noise_dp"])
