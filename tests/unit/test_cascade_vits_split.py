"""The Piper graph cut at its decoder's input: the two parts are the whole graph, the decoder's reach read from its
convolutions is what windows need, and windows of any size, each with that reach around it, join into the whole
decode; a decoder that is not convolutional is refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from engine.cascade import vits_noise, vits_split
from engine.cascade.packages import PIPER_JOE
from engine.cascade.voice import _MODEL
from tests.unit.test_cascade_vits_noise import HELLO, graph_feed, session

TOLERANCE = 1e-5  # windows joined against one decode: measured up to 1.4e-6 on five clauses, on samples within +-1


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return vits_noise.with_noise_inputs(PIPER_JOE.path(_MODEL))


@pytest.fixture(scope="module")
def parts(model: onnx.ModelProto) -> vits_split.VitsParts:
    return vits_split.split(model)


@pytest.fixture(scope="module")
def feed() -> dict[str, np.ndarray]:
    graph = graph_feed(HELLO)
    ids = graph["input"].shape[1]
    return graph | vits_noise.draw(3, 0, ids, 8 * ids)


@pytest.fixture(scope="module")
def z(parts: vits_split.VitsParts, feed: dict[str, np.ndarray]) -> np.ndarray:
    z: np.ndarray = session(parts.latent).run([vits_split.Z], feed)[0]
    return z


def decode_in_windows(decoder: ort.InferenceSession, z: np.ndarray, window: int, reach: int) -> np.ndarray:
    pieces, frames = [], z.shape[2]
    for start in range(0, frames, window):
        end = min(frames, start + window)
        lo, hi = max(0, start - reach), min(frames, end + reach)
        audio = decoder.run([vits_split.AUDIO], {vits_split.Z: z[:, :, lo:hi]})[0].reshape(-1)
        pieces.append(audio[(start - lo) * 256 : (end - lo) * 256])
    return np.concatenate(pieces)


def test_the_two_parts_are_the_whole_graph(model: onnx.ModelProto, parts: vits_split.VitsParts,
                                          feed: dict[str, np.ndarray], z: np.ndarray) -> None:
    whole = session(model.SerializeToString()).run(["output"], feed)[0].reshape(-1)
    audio = session(parts.decoder).run([vits_split.AUDIO], {vits_split.Z: z})[0].reshape(-1)
    assert z.shape[:2] == (1, 192) and audio.size == z.shape[2] * parts.hop_samples
    np.testing.assert_array_equal(audio, whole)


def test_the_decoders_reach_is_read_from_its_convolutions(parts: vits_split.VitsParts) -> None:
    # conv_pre +-3 frames, the upsamplers (x8, x8, x4) and their residual blocks' dilated convolutions: 11.1 frames
    assert (parts.reach_frames, parts.hop_samples) == (12, 256)


@pytest.mark.parametrize("window", [1, 7, 32, 1000])
def test_windows_with_the_reach_around_them_join_into_the_whole_decode(
        parts: vits_split.VitsParts, z: np.ndarray, window: int) -> None:
    decoder = session(parts.decoder)
    whole = decoder.run([vits_split.AUDIO], {vits_split.Z: z})[0].reshape(-1)
    joined = decode_in_windows(decoder, z, window, parts.reach_frames)
    assert joined.size == whole.size
    assert np.abs(joined - whole).max() <= TOLERANCE
    short = decode_in_windows(decoder, z, window, parts.reach_frames - 4)
    assert window >= z.shape[2] or np.abs(short - whole).max() > 10 * TOLERANCE  # less reach is off by far more


def test_a_sentence_is_decoded_as_its_first_frames_then_the_rest() -> None:
    assert vits_split.windows(157, 32) == [(0, 32), (32, 157)]
    assert vits_split.windows(32, 32) == [(0, 32)]
    assert vits_split.windows(20, 32) == [(0, 20)]


def test_a_decoder_that_is_not_convolutional_is_refused(model: onnx.ModelProto) -> None:
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    (node,) = [n for n in changed.graph.node if n.name == "/dec/LeakyRelu"]
    node.op_type = "Softmax"  # a pointwise op no longer: what it reads along time is unknown
    with pytest.raises(ValueError, match="the decoder holds Softmax"):
        vits_split.split(changed)
