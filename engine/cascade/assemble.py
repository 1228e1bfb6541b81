"""Assembling the cascade: the ears at the front door, the language model behind the Thinker stage, the voice
in a stage of its own, wired into the same orchestrator, gate and front end as the staged engine, so the edge
cannot tell the two apart.

The models come from their registry packages (engine/cascade/packages.py), or the ears' and the voice's fallbacks
(pocketsphinx's wheel, Debian's festival) where the profile's `cascade` section picks them; the CPU's two threads of work (the Thinker stage's
steps and the voice's clauses) each get a share of the cores, the ears another.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from engine.admission import Admission
from engine.api import SAMPLE_RATE_HZ, Engine, EngineError, ModelInfo
from engine.cascade import brain, festival
from engine.cascade.brain import BrainRunner
from engine.cascade.ears import WhisperEars
from engine.cascade.festival import FestivalVoice
from engine.cascade.listen import Ears, ListeningPrompts
from engine.cascade.packages import PIPER_JOE, SMOLLM2, WHISPER
from engine.cascade.speak import SpeakStage, Voice
from engine.cascade.sphinx import SphinxEars
from engine.cascade.voice import PiperVoice
from engine.frontend import Frontend
from engine.gate import Gate
from engine.handoff import Inbox, ReportQueue
from engine.metrics import EngineMetrics
from engine.orchestrator import Orchestrator
from engine.profile import CascadeConfig, DeployProfile
from engine.prompt import PromptBuilder
from engine.stages.policy import FirstPacketPolicy
from engine.stages.thinker import ThinkerStage
from engine.weights.cache import default_cache_dir

log = logging.getLogger(__name__)

MODEL_ID = "assistant"
# each voice's one speaker, by the profile's `cascade.voice`
SPEAKERS = {"piper": "joe", "festival": festival.SPEAKER}
LISTENS = {"whisper": "Whisper tiny.en listens", "pocketsphinx": "pocketsphinx listens (a fallback, weak)"}
SPEAKS = {"piper": "Piper's en_US joe voice speaks", "festival": "festival's US English slt voice speaks (a fallback)"}


def description(cascade: CascadeConfig) -> str:
    return (f"a CPU cascade of small real models: {LISTENS[cascade.ears]}, SmolLM2-135M-Instruct answers (fluent "
            f"English, often wrong), {SPEAKS[cascade.voice]}")


def model_info(profile: DeployProfile) -> ModelInfo:
    return ModelInfo(model_id=MODEL_ID, is_random_weights=False, description=description(profile.cascade),
                     max_model_len=profile.stages.thinker.max_model_len,
                     speakers=(SPEAKERS[profile.cascade.voice],), codec_frame_samples=SAMPLE_RATE_HZ // 25,
                     temperature=profile.stages.thinker.sampling.temperature)


def assistant_engine(profile: DeployProfile, cache_dir: Path | None = None) -> Engine:
    """The cascade in this process (its only topology), models loaded now."""
    if profile.engine.where != "in_process" or profile.engine.http_workers != 1:
        raise EngineError("the assistant cascade runs in the server's own process: engine.where in_process, "
                          "http_workers 1")
    if any(not d.startswith("cpu") for d in (profile.stages.thinker.device,)):
        raise EngineError("the assistant cascade runs on the CPU")
    speaker = SPEAKERS[profile.cascade.voice]
    if profile.stages.talker.default_speaker != speaker:
        raise EngineError(f"stages.talker.default_speaker: the {profile.cascade.voice} voice's one speaker is "
                          f"{speaker}, got {profile.stages.talker.default_speaker}")
    started = time.perf_counter()
    cascade = profile.cascade
    packages = [WHISPER] if cascade.ears == "whisper" else []
    packages += [SMOLLM2, *([PIPER_JOE] if cascade.voice == "piper" else [])]
    for package in packages:
        log.info("model package %s %s (%s): %s", package.name, package.version, package.license, package.inside)
    threads = max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(threads)
    ears = _ears(cascade)
    model, tokenizer = brain.load(cache_dir or default_cache_dir())
    voice = _voice(cascade, threads)
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


def _ears(cascade: CascadeConfig) -> Ears:
    if cascade.ears == "pocketsphinx":
        return SphinxEars.load()
    # one thread is as fast as two for tiny.en; two workers finish overlapping turns sooner (engine/cascade/ears.py)
    return WhisperEars.from_package(cpu_threads=1, workers=2)


def _voice(cascade: CascadeConfig, threads: int) -> Voice:
    if cascade.voice == "festival":
        return FestivalVoice.load()
    return PiperVoice.load(threads=threads)
