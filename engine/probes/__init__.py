"""The engine's probes, off the request path and off its faces: what the `voice-gateway accuracy`, `kernels` and
`steps` and `vision` commands (voice_gateway/probe_cli.py) measure. `measure_accuracy`: bf16 and FP8 against float32 on one
model's weights; `measure_experts_timing`: bf16 and FP8 experts' time; `measure_predictor_timing`: a code predictor
frame's; `measure_attention_timing`: decode rows' attention over long contexts; `measure_step_timing`: a Thinker
step by decode rows, context and prompt tokens; `measure_vision_timing`: the vision tower's call by pictures."""

from engine.probes.accuracy import measure as measure_accuracy
from engine.probes.attention_timing import measure as measure_attention_timing
from engine.probes.experts_timing import measure as measure_experts_timing
from engine.probes.predictor_timing import measure as measure_predictor_timing
from engine.probes.step_timing import measure as measure_step_timing
from engine.probes.vision_timing import measure as measure_vision_timing

__all__ = [
    "measure_accuracy",
    "measure_attention_timing",
    "measure_experts_timing",
    "measure_predictor_timing",
    "measure_step_timing",
    "measure_vision_timing",
]
