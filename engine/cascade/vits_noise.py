"""The noise a Piper VITS graph samples, made graph inputs: owns the edit that turns each RandomNormalLike node into
an input, the inputs' names and the seeded draws that feed them.

onnxruntime seeds each of the graph's two RandomNormalLike nodes (the duration predictor's, the flow prior's)
once per session and every run advances it, so a clause's audio would depend on what the session spoke before.
Each node is replaced by nodes that read its noise from an input, drawn by numpy from the caller's seed. The flow
prior's noise is per frame, a count known only once durations are drawn: the graph tiles and slices its input to
the node's shape, so a buffer of any length runs, and the caller runs a sentence again, exactly, when it made
more frames than the buffer held."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

NOISE_DP, NOISE_FLOW = "noise_dp", "noise_flow"
_NODES = {"/dp/RandomNormalLike": NOISE_DP, "/RandomNormalLike": NOISE_FLOW}
_FLOW_CHANNELS = 192  # the flow prior's noise: [batch, 192, frames]


def with_noise_inputs(model: Path) -> onnx.ModelProto:
    """The VITS graph at `model` with its noise read from the inputs `noise_dp` and `noise_flow`. Each node's output
    keeps its name: the nodes that read the noise are unchanged."""
    proto = onnx.load(model)
    graph = proto.graph
    nodes: list[onnx.NodeProto] = []
    replaced: list[str] = []
    for node in graph.node:
        if node.op_type != "RandomNormalLike":
            nodes.append(node)
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        # float32 noise of unit variance, as `draw` makes it: a mean, scale or seed here would be lost
        float32 = {"dtype": onnx.TensorProto.FLOAT}
        assert node.name in _NODES and attributes == float32, f"unexpected noise node {node.name!r} {attributes}"
        noise = _NODES[node.name]
        nodes += _noise_from_input(noise, node.input[0], node.output[0])
        dims = ("batch", "channels", "length")
        graph.input.append(helper.make_tensor_value_info(noise, onnx.TensorProto.FLOAT, dims))
        replaced.append(node.name)
    assert sorted(replaced) == sorted(_NODES), f"noise nodes found: {replaced}, expected {list(_NODES)}"
    del graph.node[:]
    graph.node.extend(nodes)
    return proto


def _noise_from_input(noise: str, x: str, y: str) -> list[onnx.NodeProto]:
    """The nodes that replace `y = RandomNormalLike(x)`: the input `noise` tiled and sliced to x's shape."""
    names = "shape have 1 less more reps tiled 0".split()
    shape, have, one, less, more, reps, tiled, zero = (f"{y}/{k}" for k in names)
    ops = [("Shape", [x], shape), ("Shape", [noise], have), ("Div", [have, have], one),
           ("Sub", [shape, one], less), ("Add", [less, have], more), ("Div", [more, have], reps),  # ceil(shape / have)
           ("Tile", [noise, reps], tiled), ("Sub", [shape, shape], zero), ("Slice", [tiled, zero, shape], y)]
    return [helper.make_node(op, inputs, [output], name=output) for op, inputs, output in ops]


def draw(seed: int, sentence: int, ids: int, frames: int) -> dict[str, np.ndarray]:
    """The noise of sentence `sentence` of a call seeded `seed`: noise_dp [1, 2, ids], noise_flow [1, 192, frames].
    The flow's noise is drawn time-major, so a longer buffer starts with the same noise and a second run is exact."""
    flow = np.random.default_rng((seed, sentence, 1)).standard_normal((frames, _FLOW_CHANNELS), np.float32)
    return {NOISE_DP: np.random.default_rng((seed, sentence, 0)).standard_normal((1, 2, ids), np.float32),
            NOISE_FLOW: np.ascontiguousarray(flow.T)[None]}
