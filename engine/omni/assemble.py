"""Assembling the Omni engine: each stage's weights, kernels, runner and stage, wired through constructor
arguments into an `Orchestrator`: inboxes and routers first, so every stage is built knowing where its payloads
go, then per stage its model (kernels applied to it), its runner (graphs captured from it) and the stage."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.api import EngineError
from engine.core import Pools
from engine.handoff import Inbox, ReportQueue, StickyRouter, ThinkerDone
from engine.intake.images import ImagePreprocessor
from engine.metrics import EngineMetrics
from engine.omni import memory
from engine.omni.accel import packed_attention
from engine.omni.accel.compiled import keep_compiled
from engine.omni.accel.cuda_graphs import talker_capture, thinker_capture
from engine.omni.accel.predictor_attention import predictor_attention
from engine.omni.accel.prepare import load_stage
from engine.omni.accel.triton_launch import interpreted
from engine.omni.memory import TALKER_HEADER_ROWS, MemoryPlan
from engine.omni.runners.audio_encoder import CHUNK_BUCKETS
from engine.omni.runners.code2wav import StreamingCode2Wav
from engine.omni.runners.code_predictor import (
    CodePredictor,
    StaticCodePredictor,
    TransformersCodePredictor,
    frame_attention,
)
from engine.omni.runners.kv_cache import PAGE_SIZE
from engine.omni.runners.talker import TalkerRunner
from engine.omni.runners.thinker import ThinkerRunner
from engine.omni.runners.vision_tower import Normalisation
from engine.omni.stages.code2wav import Code2WavStage, PlaybackClock
from engine.omni.stages.policy import FirstPacketPolicy
from engine.omni.stages.talker import TalkerStage
from engine.omni.stages.thinker import ThinkerStage
from engine.omni.weights.source import ModelSource
from engine.orchestrator import Orchestrator
from engine.profile import ChunkConfig, Code2WavConfig, DeployProfile, ThinkerConfig
from engine.stage import Stage

log = logging.getLogger(__name__)

# Code2Wav step buckets on a GPU (batch sizes; the frame sizes are the chunk schedule's)
_CODE2WAV_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)


def _check_triton(profile: DeployProfile) -> None:
    """The Triton kernels run on a GPU, or on the CPU in Triton's interpreter (tests); say so before loading."""
    if profile.kernels != "triton":
        return
    try:
        import triton  # noqa: F401
    except ImportError:
        raise EngineError("kernels: triton needs the triton package (pip install triton)") from None
    stages = profile.stages
    devices = (stages.thinker.device, stages.talker.device, stages.code2wav.device)
    if not all(d.startswith("cuda") for d in devices) and not interpreted():
        raise EngineError("kernels: triton needs CUDA devices (or TRITON_INTERPRET=1 on the CPU)")


def _code2wav(model: Any, cfg: Code2WavConfig, chunks: ChunkConfig, graphs: bool) -> StreamingCode2Wav:
    """On a GPU, steps are padded to a fixed set of shapes, each met once here rather than under load (cuDNN's first
    meeting of a shape is slow); with graphs each shape is also captured."""
    if not cfg.device.startswith("cuda"):
        return StreamingCode2Wav(model, cfg.max_streams)
    batches = sorted({b for b in _CODE2WAV_BATCHES if b < cfg.max_batch} | {cfg.max_batch})
    decoder = StreamingCode2Wav(model, cfg.max_streams, batch_buckets=tuple(batches), frame_buckets=chunks.sizes(),
                                max_step_frames=cfg.max_step_frames)
    started = time.perf_counter()
    count = decoder.warm_up()
    log.info("code2wav: %d step shapes warmed in %.1f s", count, time.perf_counter() - started)
    if graphs:
        # the graphs' pool cannot reuse blocks the warm-up left cached, and after the KV caches little is free
        torch.cuda.empty_cache()
        try:
            log.info("code2wav: %d step shapes captured as CUDA graphs", decoder.capture_graphs())
        except Exception:
            log.exception("code2wav: CUDA graph capture failed; steps run eagerly")
    return decoder


def _log_memory(what: str, device: str) -> None:
    """What a part of the engine left allocated on its GPU: the memory plan in the log, one line a part."""
    if not device.startswith("cuda"):
        return
    free, total = torch.cuda.mem_get_info(device)
    gib = 1 << 30
    log.info("GPU memory after %s: %.1f GiB allocated, %.1f GiB reserved, %.1f of %.1f GiB free", what,
             torch.cuda.memory_allocated(device) / gib, torch.cuda.memory_reserved(device) / gib, free / gib,
             total / gib)


def _code_predictor(talker: Any, compiled: bool, triton: bool) -> CodePredictor:
    """One for all copies: it holds no per-request state (and fuses the shared weights once)."""
    with torch.inference_mode():
        if compiled:
            return StaticCodePredictor(talker.code_predictor, talker.model.codec_embedding, compiled=True,
                                       attention=predictor_attention if triton else frame_attention)
        return TransformersCodePredictor(talker.code_predictor, talker.model.codec_embedding)


def _route(inboxes: list[Inbox], is_last: Callable[[Any], bool], routers: list[StickyRouter]) -> Callable[[Any], None]:
    if len(inboxes) == 1:
        return inboxes[0].put
    router = StickyRouter(inboxes, is_last)
    routers.append(router)
    return router.put


def _no_talker(item: Any) -> None:
    raise AssertionError(f"this model has no talker; admission lets no audio request in: {item!r}")


def _capture_vision(runner: ThinkerRunner, vision_config: Any, tk: ThinkerConfig) -> int:
    """The tower's graphs for the profile's common picture sizes (as the intake resizes them); a capture that
    fails leaves the tower eager, loudly."""
    resize = ImagePreprocessor(vision_config, min_pixels=tk.image_min_pixels, max_pixels=tk.image_max_pixels)
    try:
        return runner.vision.capture([resize.grid(*shape) for shape in tk.image_graph_shapes])
    except Exception:
        log.exception("thinker: the vision tower's CUDA graph capture failed; it runs eagerly")
        runner.vision.graphs.clear()
        return 0


def _name(kind: str, index: int, copies: int) -> str:
    return kind if copies == 1 else f"{kind}.{index}"


def _share_cores(profile: DeployProfile, has_talker: bool) -> None:
    """Stages on the CPU run at once, each in its own thread, so each spreads its ops over its own share of the
    process's cores rather than all of them contending for the same cores."""
    stages = profile.stages
    threads = [stages.thinker.device]
    if has_talker:
        threads += [stages.talker.device] * stages.talker.copies + [stages.code2wav.device] * stages.code2wav.copies
    on_cpu = sum(device == "cpu" for device in threads)
    if on_cpu:
        cores = _cores()
        torch.set_num_threads(max(1, cores // on_cpu))
        log.info("torch: %d of %d threads per op for each of %d stages on the CPU", torch.get_num_threads(), cores, on_cpu)


def _cores() -> int:
    """What this process may use: OMP_NUM_THREADS where set (Ray sets it to a replica's `cpus`), else the
    cores it may run on. Not torch's current count, which an engine built earlier in the process set."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return len(os.sched_getaffinity(0))


def _memory_plan(source: ModelSource, profile: DeployProfile) -> MemoryPlan | None:
    """The pools and the experts' precision sized to the GPU, where every stage shares one; None elsewhere (the
    profile's own numbers)."""
    s = profile.stages
    devices = {s.thinker.device, *((s.talker.device, s.code2wav.device) if source.has_talker else ())}
    if len(devices) != 1 or not s.thinker.device.startswith("cuda"):
        return None
    config = source.config
    stages = ("thinker", "talker", "code2wav") if source.has_talker else ("thinker",)
    plan = memory.plan(profile, memory.card_of(s.thinker.device, profile.memory.card_gib),
                       memory.count_params(source, stages),
                       memory.position_bytes(config.thinker_config.text_config),
                       memory.position_bytes(config.talker_config.text_config) if source.has_talker else 0)
    log.info("capacity: %s", plan.line())
    return plan


def assemble(source: ModelSource, profile: DeployProfile) -> Orchestrator:
    stages_cfg, config = profile.stages, source.config
    _check_triton(profile)
    _share_cores(profile, source.has_talker)
    triton = profile.kernels == "triton"
    graphs = profile.cuda_graphs
    if any(s.device.startswith("cuda") for s in (stages_cfg.thinker, stages_cfg.talker, stages_cfg.code2wav)):
        keep_compiled(source.cache_dir / "compiled")
    metrics, reports = EngineMetrics(), ReportQueue()
    policy = FirstPacketPolicy(profile.first_packet, profile.async_chunk)
    clock = PlaybackClock()
    has_talker = source.has_talker
    tk, tl, cw = stages_cfg.thinker, stages_cfg.talker, stages_cfg.code2wav
    thinker_inbox = Inbox()
    talker_inboxes = [Inbox() for _ in range(tl.copies if has_talker else 0)]
    code2wav_inboxes = [Inbox() for _ in range(cw.copies if has_talker else 0)]
    routers: list[StickyRouter] = []
    talker_pages = 0  # every Talker copy's pool

    plan = _memory_plan(source, profile)
    if plan and plan.code2wav_step_frames:
        cw = dataclasses.replace(cw, max_step_frames=plan.code2wav_step_frames)  # narrowed where the card is small
    quantization = plan.quantization if plan else "none" if profile.quantization == "auto" else profile.quantization
    # every stage's weights first: the pools take what they leave
    thinker = load_stage(source, "thinker", tk.device, tk.dtype, triton=triton, quantization=quantization)
    if has_talker:
        talker = load_stage(source, "talker", tl.device, tl.dtype, triton=triton, quantization=quantization)
        code2wav = load_stage(source, "code2wav", cw.device, cw.dtype, triton=triton, quantization=quantization)
    with torch.inference_mode():
        on_gpu = tk.device.startswith("cuda")
        thinker_runner = ThinkerRunner(thinker, config, max_batch=tk.max_batch, max_len=tk.max_model_len,
                                       attention=packed_attention.KernelAttention.on(tk.device) if triton else None,
                                       capture=thinker_capture(tk.max_step_tokens) if graphs else None,
                                       audio_buckets=CHUNK_BUCKETS if on_gpu else (),
                                       audio_graphed=on_gpu and graphs, cold=metrics.cold_work,
                                       audio_timed=metrics.audio_tower.observe,
                                       vision_timed=metrics.vision_tower.observe,
                                       kv_tokens=plan.thinker_positions if plan else tk.kv_cache_tokens,
                                       image_normalisation=Normalisation.for_checkpoint(source.path))
        if on_gpu:
            started = time.perf_counter()
            count = thinker_runner.audio.warm_up()
            log.info("thinker: audio tower warmed at %d chunk counts in %.1f s", count, time.perf_counter() - started)
            if graphs:
                started = time.perf_counter()
                count = _capture_vision(thinker_runner, config.thinker_config.vision_config, tk)
                log.info("thinker: vision tower graphed for %d picture grids in %.1f s", count,
                         time.perf_counter() - started)
            if triton:
                started = time.perf_counter()
                count = thinker_runner.warm_eager()
                log.info("thinker: eager steps (those no graph fits) warmed in %d steps in %.1f s", count,
                         time.perf_counter() - started)
    _log_memory("the thinker (weights, KV, graphs)", tk.device)
    stages: list[Stage] = []
    to_talker = _route(talker_inboxes, lambda item: isinstance(item, ThinkerDone), routers) if has_talker else _no_talker
    if has_talker:
        to_code2wav = _route(code2wav_inboxes, lambda item: item.is_final, routers)
        with torch.inference_mode():
            tts_ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
            tts_embeds = thinker_runner.embed(tts_ids)
        predictor = _code_predictor(talker, compiled=graphs, triton=triton)
        to_thinker = thinker_inbox.put if policy.paces_text else None
        for i, inbox in enumerate(talker_inboxes):
            with torch.inference_mode():
                runner = TalkerRunner(
                    talker, config, tts_embeds, max_batch=tl.max_batch, max_len=profile.stages.talker_max_len,
                    kv_tokens=plan.talker_rows if plan else tl.kv_cache_tokens, predictor=predictor,
                    attention=packed_attention.KernelAttention.on(tl.device) if triton else None,
                    capture=talker_capture(tl.max_step_tokens) if graphs else None, cold=metrics.cold_work)
            stages.append(TalkerStage(runner, tl, inbox, to_code2wav, to_thinker, reports.put, metrics,
                                      _name("talker", i, tl.copies)))
            talker_pages += runner.kv.num_pages
            _log_memory(f"{_name('talker', i, tl.copies)} (weights, KV, graphs)", tl.device)
        # copies share the stage's weights; each has its own state, graphs and thread
        for i, inbox in enumerate(code2wav_inboxes):
            stages.append(Code2WavStage(_code2wav(code2wav, cw, profile.async_chunk, graphs), cw, profile.async_chunk, clock, inbox,
                                        reports.put, metrics, _name("code2wav", i, cw.copies)))
            _log_memory(_name("code2wav", i, cw.copies), cw.device)
    tokenizer = source.tokenizer()
    eos_ids = {config.im_end_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    thinker_stage = ThinkerStage(thinker_runner, tk, tokenizer, eos_ids, policy, thinker_inbox, to_talker, reports.put,
                                 metrics)
    return Orchestrator(
        thinker_inbox=thinker_inbox,
        stages={stage.name: stage for stage in (thinker_stage, *stages)},
        reports=reports,
        metrics=metrics,
        speaks=has_talker,
        routers=tuple(routers),
        capacity=plan.line() if plan else "",
        pools=Pools(thinker_runner.kv.num_pages * PAGE_SIZE, talker_pages * PAGE_SIZE, tl.max_frames + TALKER_HEADER_ROWS,
                    PAGE_SIZE, tk.max_model_len, stages_cfg.talker_max_len),
    )
