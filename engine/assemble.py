"""Assembling an engine from a checkpoint and a deploy profile: load each stage, wire the handoffs."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from engine.accel import snake
from engine.accel.cuda_graphs import apply_talker_graphs, apply_thinker_graphs
from engine.api import EngineError, ModelInfo
from engine.handoff import StickyRouter, ThinkerDone
from engine.metrics import EngineMetrics
from engine.profile import DeployProfile
from engine.prompt import PromptBuilder
from engine.runners.code2wav import Code2WavRunner
from engine.runners.code2wav_stream import StreamingCode2Wav
from engine.runners.code_predictor import StaticCodePredictor
from engine.runners.talker import TalkerRunner
from engine.runners.thinker import ThinkerRunner
from engine.stages.code2wav import Code2WavStage
from engine.stages.talker import TalkerStage
from engine.stages.thinker import ThinkerStage
from engine.weights.checkpoint import load_config, load_stage, resolve_checkpoint
from engine.weights.full_size import build_dummy_stage, full_size_config_dict
from engine.weights.tiny import TINY_DESCRIPTION, TINY_MODEL_ID, default_cache_dir
from engine.weights.tokenizer import build_tokenizer

log = logging.getLogger(__name__)


def _unbound_report(item: Any) -> None:
    raise AssertionError(f"stage reported before the engine started: {item!r}")


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"the deploy profile asks for {device}, but CUDA is not available here")


def _graphs_or_eager(stage: str, apply: Any, runner: Any) -> None:
    """Graphs are an optimisation: a capture that fails leaves the stage eager, loudly."""
    try:
        with torch.inference_mode():
            apply(runner)
    except Exception:
        log.exception("%s: CUDA graph capture failed; this stage runs eagerly", stage)
        runner.graphed_decode = None
        runner.graphed_prefill = None
        if hasattr(runner, "graphed_predictor"):
            runner.graphed_predictor = None
        if getattr(runner, "static_predictor", None) is not None and runner.static_predictor.compiled:
            runner.static_predictor = None  # torch.compile may be what failed: back to transformers' predictor


def _check_triton(stage: str, cfg) -> None:
    """The Triton paths run on a GPU, or on the CPU in Triton's interpreter (tests); say so before loading."""
    wants = (getattr(cfg, "moe_implementation", None) == "fused_triton"
             or getattr(cfg, "decode_attention", None) == "triton" or getattr(cfg, "fused_snake", False))
    if not wants:
        return
    try:
        import triton  # noqa: F401
    except ImportError:
        raise EngineError(f"stages.{stage}: fused_triton / decode_attention: triton / fused_snake need the triton package") from None
    if not cfg.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise EngineError(f"stages.{stage}: the Triton kernels need a CUDA device (or TRITON_INTERPRET=1 on the CPU)")


def _use_slot_attention(model: torch.nn.Module, runner: Any) -> None:
    from engine.accel import slot_attention

    slot_attention.enable(model)
    runner.kv.decode_kernel = True


def _streaming_code2wav(code2wav: torch.nn.Module, cfg, chunks) -> StreamingCode2Wav:
    """On a GPU, steps are padded to a fixed set of shapes, each met once here rather than under load."""
    if not (cfg.bucket_shapes and cfg.device.startswith("cuda")):
        return StreamingCode2Wav(code2wav, cfg.max_streams)
    batches = sorted({b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64) if b < cfg.max_batch} | {cfg.max_batch})
    stream = StreamingCode2Wav(code2wav, cfg.max_streams, batch_buckets=tuple(batches),
                               frame_buckets=chunks.sizes())
    started = time.perf_counter()
    count = stream.warm_up()
    log.info("code2wav: %d step shapes warmed in %.1f s", count, time.perf_counter() - started)
    if not cfg.enforce_eager:
        try:
            log.info("code2wav: %d step shapes captured as CUDA graphs", stream.capture_graphs())
        except Exception:
            log.exception("code2wav: CUDA graph capture failed; steps run eagerly")
            stream.graphs.clear()
    return stream


def _static_predictor(talker: torch.nn.Module, cfg) -> StaticCodePredictor | None:
    """One for all replicas: it holds no per-request state, and fuses the shared weights once."""
    if cfg.code_predictor == "transformers":
        return None
    with torch.inference_mode():
        predictor = StaticCodePredictor(talker.code_predictor, talker.model.codec_embedding,
                                        compiled=cfg.code_predictor == "compiled")
    log.info("talker code predictor: %s", cfg.code_predictor)
    return predictor


def _talker_runner(talker: torch.nn.Module, config, tts_embeds: torch.Tensor, stages_cfg,
                   static_predictor: StaticCodePredictor | None) -> TalkerRunner:
    cfg = stages_cfg.talker
    with torch.inference_mode():
        runner = TalkerRunner(
            talker, config, tts_embeds, max_batch=cfg.max_batch,
            # A reply's talker sequence: the user turns plus one row per frame.
            max_len=stages_cfg.thinker.max_model_len + cfg.max_frames + 16,
        )
    runner.static_predictor = static_predictor
    if cfg.decode_attention == "triton":
        _use_slot_attention(talker.model, runner)
    if not cfg.enforce_eager and cfg.device.startswith("cuda"):
        _graphs_or_eager("talker", partial(apply_talker_graphs, prefill=cfg.graph_prefill,
                                           groups=cfg.graph_prefill_groups, max_group=cfg.max_prefill_batch,
                                           compile_decode=cfg.compile_decode,
                                           fine_prefill=cfg.fine_prefill_buckets), runner)
    return runner


def _code2wav_stage(code2wav: torch.nn.Module, cfg, profile: DeployProfile, metrics: EngineMetrics) -> Code2WavStage:
    if cfg.fused_snake:
        log.info("code2wav: %d SnakeBeta activations fused", snake.enable(code2wav))
    with torch.inference_mode():
        runner = Code2WavRunner(code2wav)
    stream = None
    if cfg.streaming and profile.async_chunk.enabled:
        stream = _streaming_code2wav(code2wav, cfg, profile.async_chunk)
    return Code2WavStage(runner, cfg, profile.async_chunk, _unbound_report, metrics, stream)


def _route(stages: list[Any], is_last: Callable[[Any], bool], routers: list[StickyRouter]) -> Callable[[Any], None]:
    """Where payloads for a stage go: its inbox, or a sticky router over its replicas' inboxes."""
    if len(stages) == 1:
        return stages[0].inbox.put
    router = StickyRouter([stage.inbox for stage in stages], is_last)
    routers.append(router)
    return router.put


def _named(kind: str, stages: list[Any]) -> dict[str, Any]:
    if len(stages) > 1:
        for i, stage in enumerate(stages):
            stage.name = f"{kind}.{i}"  # metrics, logs and thread names tell replicas apart
    return {stage.name: stage for stage in stages}


def build_engine_parts(model: str, profile: DeployProfile, cache_dir: Path | None) -> dict[str, Any]:
    from transformers import AutoTokenizer, Qwen3OmniMoeConfig, WhisperFeatureExtractor

    stages_cfg = profile.stages
    for cfg in (stages_cfg.thinker, stages_cfg.talker, stages_cfg.code2wav):
        _check_device(cfg.device)
    _check_triton("thinker", stages_cfg.thinker)
    _check_triton("talker", stages_cfg.talker)
    _check_triton("code2wav", stages_cfg.code2wav)
    dummy = profile.load_format == "dummy"
    if dummy:
        # Full-size random weights need no checkpoint; the tokenizer is built like the tiny model's.
        path = Path(tempfile.mkdtemp(prefix="vg-dummy-tokenizer-"))
        build_tokenizer(path)
        config = Qwen3OmniMoeConfig(**full_size_config_dict())
        features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16_000, padding_value=0.0)
        log.warning("load_format=dummy: full-size architecture with RANDOM weights, for benchmarks only")
    else:
        path = resolve_checkpoint(model, cache_dir or default_cache_dir())
        config = load_config(path)
        features = WhisperFeatureExtractor.from_pretrained(path)
    is_tiny = model == TINY_MODEL_ID and not dummy
    if is_tiny:
        log.warning("serving the tiny random-weight model: %s", TINY_DESCRIPTION)
    tokenizer = AutoTokenizer.from_pretrained(path)
    metrics = EngineMetrics()

    def load(stage: str, cfg) -> torch.nn.Module:
        if dummy:
            model = build_dummy_stage(stage, device=cfg.device, dtype=cfg.dtype)[0]
        else:
            model = load_stage(path, stage, device=cfg.device, dtype=cfg.dtype).model  # type: ignore[arg-type]
        moe = getattr(cfg, "moe_implementation", "auto")
        if moe == "fused_triton":
            from engine.accel import fused_moe

            fused_moe.enable(model)
        elif moe != "auto":
            model.set_experts_implementation(moe)
        log.info("%s experts: %s", stage, getattr(model.config, "_experts_implementation", "n/a"))
        return model

    thinker = load("thinker", stages_cfg.thinker)
    thinker_runner = ThinkerRunner(
        thinker, config, max_batch=stages_cfg.thinker.max_batch, max_len=stages_cfg.thinker.max_model_len
    )
    if stages_cfg.thinker.decode_attention == "triton":
        _use_slot_attention(thinker_runner.text_model, thinker_runner)
    if not stages_cfg.thinker.enforce_eager and stages_cfg.thinker.device.startswith("cuda"):
        thinker_cfg = stages_cfg.thinker
        _graphs_or_eager("thinker", partial(apply_thinker_graphs, prefill=thinker_cfg.graph_prefill,
                                            groups=thinker_cfg.graph_prefill_groups,
                                            max_tokens=thinker_cfg.prefill_token_budget,
                                            compile_decode=thinker_cfg.compile_decode,
                                            fine_prefill=thinker_cfg.fine_prefill_buckets), thinker_runner)
    has_talker = bool(config.enable_audio_output)
    stages: dict[str, Any] = {}
    to_talker = _unbound_report
    routers: list[StickyRouter] = []
    samples_per_frame = 0
    if has_talker:
        talker = load("talker", stages_cfg.talker)
        code2wav = load("code2wav", stages_cfg.code2wav)
        # Replicas share their stage's weights; each has its own caches, graphs, state and thread.
        code2wav_stages = [_code2wav_stage(code2wav, stages_cfg.code2wav, profile, metrics)
                           for _ in range(stages_cfg.code2wav.replicas)]
        samples_per_frame = code2wav_stages[0].runner.samples_per_frame
        to_code2wav = _route(code2wav_stages, lambda item: item.is_final, routers)
        with torch.inference_mode():
            tts_ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
            tts_embeds = thinker_runner.embed(tts_ids)
        static_predictor = _static_predictor(talker, stages_cfg.talker)
        talker_stages = [
            TalkerStage(_talker_runner(talker, config, tts_embeds, stages_cfg, static_predictor), stages_cfg.talker,
                        to_code2wav, _unbound_report, metrics)
            for _ in range(stages_cfg.talker.replicas)
        ]
        to_talker = _route(talker_stages, lambda item: isinstance(item, ThinkerDone), routers)
        stages = {**_named("talker", talker_stages), **_named("code2wav", code2wav_stages)}
    eos_ids = {config.im_end_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    thinker_stage = ThinkerStage(
        thinker_runner, stages_cfg.thinker, tokenizer, eos_ids, to_talker, _unbound_report, metrics
    )
    if profile.async_chunk.enabled:
        thinker_stage.first_chunk_rows = profile.async_chunk.initial_chunk_frames + 1
    if stages_cfg.thinker.pace_text_lead:
        for stage in stages.values():
            if isinstance(stage, TalkerStage):
                stage.to_thinker = thinker_stage.inbox.put
    speakers = tuple(sorted((config.talker_config.speaker_id or {}) if has_talker else {}))
    info = ModelInfo(
        model_id=model,
        is_random_weights=is_tiny or dummy,
        description=(
            TINY_DESCRIPTION if is_tiny
            else "full-size Qwen3-Omni with random weights (load_format=dummy): for benchmarks only" if dummy
            else f"Qwen3-Omni checkpoint at {path}"
        ),
        max_model_len=stages_cfg.thinker.max_model_len,
        speakers=speakers,
        codec_frame_samples=samples_per_frame,
    )
    prompt_builder = PromptBuilder(tokenizer, features, n_window=config.thinker_config.audio_config.n_window)
    for stage in (thinker_stage, *stages.values()):
        stage.own_cuda_stream = stages_cfg.own_cuda_streams
    return {
        "info": info,
        "profile": profile,
        "prompt_builder": prompt_builder,
        "stages": {"thinker": thinker_stage, **stages},
        "metrics": metrics,
        "has_talker": has_talker,
        "routers": tuple(routers),
    }
