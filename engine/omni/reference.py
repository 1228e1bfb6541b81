"""The same-run baseline core: plain transformers `generate(return_audio=True)`, one request at a time.

`ReferenceCore` runs requests in arrival order on a worker thread. Nothing streams early: when generate()
returns, the reply's text leaves as one TextDelta and its audio as one AudioChunk, then Finished. It is the
library's path, served through the same HTTP edge as the baseline row of the benchmark ladder. Aborts are
honoured between requests. Profile (backend: transformers_generate): the model lives on `stages.thinker.device`
in `stages.thinker.dtype`; text settings come from the Thinker's section, codec ones (max_frames, ignore_eos,
speaker, sampling) from the Talker's, with the Omni engine's meaning."""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.api import (
    SAMPLE_RATE_HZ,
    AudioChunk,
    EngineError,
    EngineHealth,
    Failed,
    Finished,
    OutputEvent,
    TextDelta,
    Timings,
)
from engine.core import SERVING, Sink
from engine.handoff import AdmittedRequest
from engine.metrics import EngineMetrics
from engine.omni.weights.checkpoint import CheckpointMismatch
from engine.omni.weights.full_size import full_size_config_dict
from engine.omni.weights.source import ModelSource
from engine.profile import DeployProfile

log = logging.getLogger(__name__)

STAGE = "generate"  # the one "stage" this engine reports in /health and /metrics
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class _Reply:
    """What one generate() call made: text ids (EOS dropped), their text, 24 kHz audio."""

    text_ids: list[int]
    text: str
    samples: np.ndarray
    stopped: bool  # the Thinker chose EOS (finish_reason "stop"), rather than hitting max_tokens


@dataclass(slots=True)
class _Job:
    request: AdmittedRequest
    sink: Sink
    submitted_at: float
    done: bool = False


class ReferenceCore:
    """Owns the model, the waiting jobs (`_waiting`, `_jobs`) and the worker thread that drains them."""

    def __init__(self, *, model: Any, tokenizer: Any, frame_samples: int, profile: DeployProfile) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.frame_samples = frame_samples
        self.profile = profile
        self.metrics = EngineMetrics()
        self.registry = self.metrics.registry
        self.device = torch.device(profile.stages.thinker.device)
        self._eos_ids = [model.config.im_end_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
        self._jobs: dict[str, _Job] = {}
        self._waiting: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._running: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def load(cls, source: ModelSource, profile: DeployProfile) -> ReferenceCore:
        cfg = profile.stages.thinker
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineError(f"the deploy profile asks for {cfg.device}, but CUDA is not available here")
        if source.load_format == "dummy":
            omni = _dummy_model(cfg.device, cfg.dtype)
        else:
            omni = _load_checkpoint(source, cfg.device, cfg.dtype)
        log.warning("backend=transformers_generate: the unoptimised baseline, one request at a time, no streaming")
        return cls(model=omni, tokenizer=source.tokenizer(), frame_samples=source.frame_samples, profile=profile)

    # -- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._work, name="reference-generate", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._waiting.put(None)
        if self._thread is not None:
            # a generate() in flight runs to its end; do not wait for it forever
            await asyncio.to_thread(self._thread.join, 30)
        for job in list(self._jobs.values()):
            self._close(job, Failed(job.request.request_id, "server shutting down"))

    def stage_load(self) -> dict[str, int]:
        return {STAGE: len(self._jobs)}

    def health(self) -> EngineHealth:
        return SERVING

    # -- requests
    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        assert self._loop is not None, "engine not started"
        rid = request.request_id
        if rid in self._jobs:
            raise EngineError(f"request id {rid} is already in use")
        job = _Job(request, sink, time.perf_counter())
        self._jobs[rid] = job
        self.metrics.active.set(len(self._jobs))
        self.metrics.queue_depth.labels(STAGE).set(self._waiting.qsize() + 1)
        self._waiting.put(job)
        log.info("request %s queued: %d prompt tokens, audio=%s", rid, len(request.token_ids), request.want_audio)

    def abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is not None:
            if request_id == self._running:
                log.info("request %s aborted; its generate() call runs to its end", request_id)
            self.metrics.requests.labels("aborted").inc()
            self._close(job, Failed(request_id, "aborted"))

    # -- the worker thread
    def _work(self) -> None:
        while (job := self._waiting.get()) is not None:
            if job.done:  # aborted while it waited
                continue
            rid = job.request.request_id
            self._running = rid
            self.metrics.queue_depth.labels(STAGE).set(self._waiting.qsize())
            self.metrics.running.labels(STAGE).set(1)
            started = time.perf_counter()
            reply: _Reply | str
            try:
                with torch.inference_mode():
                    reply = self._generate(job)
            except Exception as e:  # one bad request must not kill the worker
                log.exception("request %s: generate() failed", rid)
                reply = f"generate() failed: {type(e).__name__}: {e}"
            finally:
                self._running = None
                self.metrics.running.labels(STAGE).set(0)
            self.metrics.batch_size.labels(STAGE).observe(1)
            self.metrics.step_seconds.labels(STAGE, "decode").observe(time.perf_counter() - started)
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._deliver, job, reply)

    def _generate(self, job: _Job) -> _Reply:
        request, thinker, talker = job.request, self.profile.stages.thinker, self.profile.stages.talker
        if request.seed is not None:
            torch.manual_seed(request.seed)
        input_ids = torch.tensor([request.token_ids], device=self.device)
        kwargs: dict[str, Any] = {
            "thinker_max_new_tokens": request.max_tokens,
            "thinker_eos_token_id": self._eos_ids,
            "thinker_do_sample": request.temperature > 0,
            **_audio_inputs(request.audio_features, self.device, self.model.dtype),
        }
        if request.temperature > 0:
            kwargs.update(thinker_temperature=request.temperature, thinker_top_k=request.top_k,
                          thinker_top_p=request.top_p)
        if thinker.ignore_eos:
            kwargs["thinker_min_new_tokens"] = request.max_tokens
        if request.want_audio:
            # generate() makes one codec frame fewer than the talker's new tokens (10 tokens, 9 frames).
            talker_tokens = talker.max_frames + 1
            s = talker.sampling
            kwargs.update(speaker=request.speaker, talker_max_new_tokens=talker_tokens, talker_temperature=s.temperature,
                          talker_top_p=s.top_p, talker_top_k=s.top_k, talker_repetition_penalty=s.repetition_penalty)
            if talker.ignore_eos:
                kwargs["talker_min_new_tokens"] = talker_tokens
        with warnings.catch_warnings():
            # The library's own path applies the talker's repetition penalty to new tokens only and says so
            # on every call; that is what this baseline measures.
            warnings.filterwarnings("ignore", message="Passing `repetition_penalty`", category=UserWarning)
            out = self.model.generate(input_ids, return_audio=request.want_audio, **kwargs)
        sequences, wav = out if request.want_audio else (out, None)
        new_ids = sequences[0, input_ids.shape[1]:].tolist()
        stopped = bool(new_ids) and new_ids[-1] in self._eos_ids
        text_ids = new_ids[:-1] if stopped else new_ids
        samples = np.zeros(0, np.float32) if wav is None else wav.reshape(-1).float().cpu().numpy()
        return _Reply(text_ids, self.tokenizer.decode(text_ids, skip_special_tokens=True), samples, stopped)

    # -- back on the event loop
    def _deliver(self, job: _Job, reply: _Reply | str) -> None:
        rid = job.request.request_id
        if job.done:  # aborted while generate() ran
            return
        if isinstance(reply, str):
            self.metrics.requests.labels("failed").inc()
            self._close(job, Failed(rid, reply))
            return
        elapsed = time.perf_counter() - job.submitted_at
        if reply.text_ids:
            self.metrics.ttft.observe(elapsed)
            job.sink(TextDelta(rid, reply.text, tuple(reply.text_ids)))
        if reply.samples.size:
            self.metrics.ttfp.observe(elapsed)
            self.metrics.rtf.observe(elapsed / (reply.samples.size / SAMPLE_RATE_HZ))
            job.sink(AudioChunk(rid, reply.samples, 0, is_last=True))
        # Each Code2Wav call drops a causal tail shorter than a frame: round the frame count up.
        frames = math.ceil(reply.samples.size / self.frame_samples) if reply.samples.size else 0
        timings = Timings(
            ttft_s=elapsed if reply.text_ids else None, ttfp_s=elapsed if reply.samples.size else None,
            total_s=elapsed, prompt_tokens=len(job.request.token_ids), prompt_audio_tokens=job.request.audio_tokens,
            completion_tokens=len(reply.text_ids), codec_frames=frames, audio_samples=int(reply.samples.size),
        )
        self.metrics.requests.labels("completed").inc()
        log.info("request %s finished (%s): %d tokens, %d frames, total=%.3fs", rid,
                 "stop" if reply.stopped else "length", timings.completion_tokens, frames, elapsed)
        self._close(job, Finished(rid, "stop" if reply.stopped else "length", timings))

    def _close(self, job: _Job, event: OutputEvent) -> None:
        if job.done:
            return
        job.done = True
        self._jobs.pop(job.request.request_id, None)
        self.metrics.active.set(len(self._jobs))
        job.sink(event)


def _audio_inputs(clips: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Input audio as generate() takes it: padded log-mel features [clips, 128, T] and their mask."""
    if not clips:
        return {}
    longest = max(f.shape[-1] for f in clips)
    features = torch.zeros(len(clips), clips[0].shape[0], longest, dtype=dtype)
    mask = torch.zeros(len(clips), longest, dtype=torch.long)
    for i, f in enumerate(clips):
        features[i, :, : f.shape[-1]] = f
        mask[i, : f.shape[-1]] = 1
    return {"input_features": features.to(device), "feature_attention_mask": mask.to(device)}


def _dummy_model(device: str, dtype: str) -> Any:
    """The full-size architecture with random weights created on `device` (as generate_baseline.py does)."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    with torch.device(device):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(
            Qwen3OmniMoeConfig(**full_size_config_dict()), dtype=_DTYPES[dtype])
    return model.eval()


def _load_checkpoint(source: ModelSource, device: str, dtype: str) -> Any:
    """The whole model through from_pretrained, failing loudly on any missing or unexpected key."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = source.path
    loaded: Any = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        path, dtype=_DTYPES[dtype], output_loading_info=True)
    model, info = loaded
    problems = {k: list(v)[:5] for k, v in info.items() if k != "error_msgs" and v}
    if problems:
        raise CheckpointMismatch(f"weights in {path} do not match the model: {problems}")
    return model.to(device).eval()
