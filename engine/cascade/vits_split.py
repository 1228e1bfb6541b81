"""A Piper VITS graph cut at its decoder's input: owns the cut (the latent part: ids and noise -> z, the decoder:
z -> samples), the decoder's reach in frames, and the windows of frames it decodes.

The decoder (HiFi-GAN) is the bulk of a sentence's cost and is convolutional along time: a sample depends only on
the frames of z within its reach, so the frames it was cut from are decoded window by window, each with `reach`
frames of z on either side, and the windows' samples, trimmed to their own frames, join into the sentence's
audio to within float rounding. The first window's audio can play while the rest is decoded. A graph whose
decoder holds an operation that is not a convolution or a pointwise op is refused: its reach is unknown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import onnx
from onnx import helper
from onnx.utils import Extractor

Z = "/Mul_7_output_0"  # the flow's output times the frame mask: [1, 192, frames]
AUDIO = "/dec/Tanh_output_0"  # [1, 1, frames * hop]
_POINTWISE = frozenset({"LeakyRelu", "Add", "Div", "Mul", "Tanh"})


@dataclass(frozen=True, slots=True)
class VitsParts:
    """The two graphs, serialised for `onnxruntime.InferenceSession`, and what windows of the decoder need."""

    latent: bytes  # the original graph's inputs -> Z
    decoder: bytes  # Z -> AUDIO
    reach_frames: int  # frames of z on either side that a frame's samples depend on
    hop_samples: int  # samples a frame of z makes


def split(model: onnx.ModelProto) -> VitsParts:
    """`model` (a Piper VITS graph) cut at its decoder's input Z."""
    extractor = Extractor(model)
    latent = extractor.extract_model([i.name for i in model.graph.input], [Z])
    decoder = extractor.extract_model([Z], [AUDIO])
    reach, hop = _reach(decoder)
    return VitsParts(latent.SerializeToString(), decoder.SerializeToString(), reach, hop)


def windows(frames: int, first_frames: int) -> list[tuple[int, int]]:
    """[start, end) frames of the pieces a sentence of `frames` frames is decoded in: the first `first_frames`, then
    the rest, or all at once when the rest would be nothing."""
    if frames <= first_frames:
        return [(0, frames)]
    return [(0, first_frames), (first_frames, frames)]


def _reach(decoder: onnx.ModelProto) -> tuple[int, int]:
    """(reach in frames, samples per frame) of the decoder, from its convolutions' sizes. A value's reach is the
    frames of z on either side of its position that it depends on; `rate` is its samples per frame."""
    reach, rate = {Z: Fraction(0)}, {Z: 1}
    for node in decoder.graph.node:  # in topological order
        inputs = [name for name in node.input if name in reach]
        if not inputs:  # a constant
            continue
        assert len({rate[name] for name in inputs}) == 1, f"{node.name} joins values at different rates"
        r, s = max(reach[name] for name in inputs), rate[inputs[0]]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            (k,), (d,), (left, right) = attributes["kernel_shape"], attributes.get("dilations", [1]), attributes["pads"]
            assert attributes.get("strides", [1]) == [1] and left + right == d * (k - 1), f"{node.name} {attributes}"
            r += Fraction(max(left, right), s)  # output n reads inputs n - left to n + right
        elif node.op_type == "ConvTranspose":
            # output n reads inputs (n + pad - j) / stride for j < k; it sits at input n / stride
            (k,), (stride,), (pad, _) = attributes["kernel_shape"], attributes["strides"], attributes["pads"]
            assert attributes.get("dilations", [1]) == [1], f"{node.name} {attributes}"
            r += Fraction(max(k - 1 - pad, pad), stride * s)
            s *= stride
        elif node.op_type not in _POINTWISE:
            raise ValueError(f"the decoder holds {node.op_type} ({node.name}): only convolutions have a known reach")
        for name in node.output:
            reach[name], rate[name] = r, s
    return math.ceil(reach[AUDIO]), rate[AUDIO]
