"""A stage's model as the engine serves it: loaded from its source, its experts in FP8 where asked, and our
kernels put in (the fused MoE, the fused SnakeBeta). The engine's assembly and the step timings load through it."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from engine.omni.accel import fp8, fused_moe, snake
from engine.omni.weights.source import ModelSource

log = logging.getLogger(__name__)


def load_stage(source: ModelSource, stage: str, device: str, dtype: str, *, triton: bool, quantization: str) -> Any:
    fp8_experts = quantization == "fp8" and stage in ("thinker", "talker")
    # dummy FP8 experts are drawn straight into e4m3: the bf16 model never exists whole
    unmade = fp8_experts and source.load_format == "dummy"
    model: Any = source.load_stage(stage, device=device, dtype=dtype, experts_on_meta=unmade)  # type: ignore[arg-type]
    if fp8_experts:
        started = time.perf_counter()
        with torch.inference_mode():
            if unmade:
                held = fp8.random_experts(model, std=model.config.initializer_range, device=device)
            else:
                held = fp8.quantize_experts(model)
        log.info("%s: experts quantized to fp8 (%.2f GiB) in %.1f s", stage, held / 2**30, time.perf_counter() - started)
    if triton and stage in ("thinker", "talker"):
        fused_moe.enable(model)
    if triton and stage == "code2wav":
        log.info("code2wav: %d SnakeBeta activations fused", snake.enable(model))
    log.info("%s experts: %s", stage, getattr(model.config, "_experts_implementation", "n/a"))
    return model
