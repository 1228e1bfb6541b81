"""Assembling the cascade: the ears at the front door, the language model behind the Thinker stage, the voice
in a stage of its own, wired into the same orchestrator, gate and front end as the staged engine, so the edge
cannot tell the two apart.

The models come from their registry packages (engine/cascade/packages.py); the CPU's two threads of work
(the Thinker stage's steps and the voice's clauses) each get a share of the cores, the ears another.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from engine.admission import Admission
from engine.api import SAMPLE_RATE_HZ, Engine, EngineError, ModelInfo
from engine.cascade import brain
from engine.cascade.brain import BrainRunner
from engine.cascade.ears import WhisperEars
from engine.cascade.listen import ListeningPrompts
from engine.cascade.packages import PACKAGES
from engine.cascade.speak import SpeakStage
from engine.cascade.voice import PiperVoice
from engine.frontend import Frontend
from engine.gate import Gate
from engine.handoff import Inbox, ReportQueue
from engine.metrics import EngineMetrics
from engine.orchestrator import Orchestrator
from engine.profile import DeployProfile
from engine.prompt import PromptBuilder
from engine.stages.policy import FirstPacketPolicy
from engine.stages.thinker import ThinkerStage
from engine.weights.cache import default_cache_dir

log = logging.getLogger(__name__)

MODEL_ID = "assistant"
SPEAKERS = ("joe",)
DESCRIPTION = ("a CPU cascade of small real models: Whisper tiny.en listens, SmolLM2-135M-Instruct answers (fluent "
               "English, often wrong), Piper's en_US joe voice speaks")


def model_info(profile: DeployProfile) -> ModelInfo:
    return ModelInfo(model_id=MODEL_ID, is_random_weights=False, description=DESCRIPTION,
                     max_model_len=profile.stages.thinker.max_model_len, speakers=SPEAKERS,
                     codec_frame_samples=SAMPLE_RATE_HZ // 25)


def assistant_engine(profile: DeployProfile, cache_dir: Path | None = None) -> Engine:
    """The cascade in this process (its only topology), models loaded now."""
    if profile.engine.where != "in_process" or profile.engine.http_workers != 1:
        raise EngineError("the assistant cascade runs in the server's own process: engine.where in_process, "
                          "http_workers 1")
    if any(not d.startswith("cpu") for d in (profile.stages.thinker.device,)):
        raise EngineError("the assistant cascade runs on the CPU")
    started = time.perf_counter()
    for package in PACKAGES:
        log.info("model package %s %s (%s): %s", package.name, package.version, package.license, package.inside)
    threads = max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(threads)
    # one thread is as fast as two for tiny.en; two workers finish overlapping turns sooner (engine/cascade/ears.py)
    ears = WhisperEars.from_package(cpu_threads=1, workers=2)
    model, tokenizer = brain.load(cache_dir or default_cache_dir())
    voice = PiperVoice.load(threads=threads)
    tk = profile.stages.thinker
    metrics, reports = EngineMetrics(), ReportQueue()
    thinker_inbox, speak_inbox = Inbox(), Inbox()
    with torch.inference_mode():
        runner = BrainRunner(model, max_batch=tk.max_batch, max_len=tk.max_model_len)
    policy = FirstPacketPolicy(profile.first_packet, profile.async_chunk)
    eos_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    thinker = ThinkerStage(runner, tk, tokenizer, eos_ids, policy, thinker_inbox, speak_inbox.put, reports.put,
                           metrics)
    speak = SpeakStage(voice, tokenizer, speak_inbox, reports.put, metrics, runner.device)
    core = Orchestrator(thinker_inbox=thinker_inbox, stages={"thinker": thinker, "speak": speak}, reports=reports,
                        metrics=metrics, has_talker=True)
    prompts = ListeningPrompts(PromptBuilder(tokenizer, None, n_window=0), ears)
    admission = Admission(model_info(profile), profile, prompts, text_on_loop=False, hear=prompts.transcript)
    log.info("assistant cascade loaded in %.1f s", time.perf_counter() - started)
    return Frontend(Gate.for_profile(core, profile), admission)
