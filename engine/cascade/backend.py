"""The cascade as a backend: the ears at the front door, the language model behind the Thinker stage (its rows zero
wide), the voice in a stage of its own, wired into the same orchestrator and gate as the Omni engine.

It hears and speaks: audio in (made text before the prompt), no images, one voice's one speaker out. The models
come from their registry packages, or the fallbacks the profile's `cascade` section picks; the Thinker stage's
steps and the voice's clauses each get a share of the CPU's cores, the ears another. It runs in the server's own
process only."""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.api import SAMPLE_RATE_HZ, EngineError, ModelInfo
from engine.cascade import brain, festival
from engine.cascade.brain import BrainRunner
from engine.cascade.ears import WhisperEars
from engine.cascade.festival import FestivalVoice
from engine.cascade.listen import Ears, ListeningPrompts
from engine.cascade.packages import PIPER_JOE, SMOLLM2, WHISPER
from engine.cascade.speak import SpeakStage, Voice
from engine.cascade.sphinx import SphinxEars
from engine.cascade.transcription import TranscribingCore
from engine.cascade.voice import PiperVoice
from engine.core import EngineCore
from engine.gate import Gate
from engine.handoff import Inbox, ReportQueue
from engine.intake.intake import Intake, ReplyLimits
from engine.intake.prompt import PromptBuilder
from engine.metrics import EngineMetrics
from engine.omni.stages.policy import FirstPacketPolicy
from engine.omni.stages.thinker import ThinkerStage
from engine.omni.weights.cache import default_cache_dir
from engine.orchestrator import Orchestrator
from engine.profile import CascadeConfig, DeployProfile, ThinkerConfig

log = logging.getLogger(__name__)

MODEL_ID = "assistant"
# each voice's one speaker, by the profile's `cascade.voice`
SPEAKERS = {"piper": "joe", "festival": festival.SPEAKER}
LISTENS = {"whisper": "Whisper tiny.en listens", "pocketsphinx": "pocketsphinx listens (a fallback, weak)"}
SPEAKS = {"piper": "Piper's en_US joe voice speaks", "festival": "festival's US English slt voice speaks (a fallback)"}


def description(cascade: CascadeConfig) -> str:
    return (f"a CPU cascade of small real models: {LISTENS[cascade.ears]}, SmolLM2-135M-Instruct answers (fluent "
            f"English, often wrong), {SPEAKS[cascade.voice]}")


@dataclass(frozen=True, slots=True)
class _Models:
    ears: Ears
    model: Any
    tokenizer: Any
    voice: Voice
    prompts: ListeningPrompts


class CascadeBackend:
    """`profile`: its `cascade` section and the gate's; the models load once, on first use, for intake and stages."""

    def __init__(self, profile: DeployProfile, cache_dir: Path | None = None) -> None:
        if profile.engine.where != "in_process" or profile.engine.http_workers != 1:
            raise EngineError("the assistant cascade runs in the server's own process: engine.where in_process, "
                              "http_workers 1")
        self.profile = profile
        self.cascade = profile.cascade
        self.cache_dir = cache_dir or default_cache_dir()
        self.threads = max(1, (os.cpu_count() or 2) // 2)

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(model_id=MODEL_ID, is_random_weights=False, description=description(self.cascade),
                         max_model_len=self.cascade.brain.max_model_len, speakers=(SPEAKERS[self.cascade.voice],),
                         codec_frame_samples=SAMPLE_RATE_HZ // 25, temperature=self.cascade.brain.sampling.temperature,
                         listens_ahead=True)

    @functools.cached_property
    def models(self) -> _Models:
        started = time.perf_counter()
        cascade = self.cascade
        packages = [WHISPER] if cascade.ears == "whisper" else []
        packages += [SMOLLM2, *([PIPER_JOE] if cascade.voice == "piper" else [])]
        for package in packages:
            log.info("model package %s %s (%s): %s", package.name, package.version, package.license, package.inside)
        torch.set_num_threads(self.threads)
        ears = _ears(cascade)
        model, tokenizer = brain.load(self.cache_dir)
        voice = _voice(cascade, self.threads)
        log.info("assistant cascade loaded in %.1f s", time.perf_counter() - started)
        return _Models(ears, model, tokenizer, voice, ListeningPrompts(PromptBuilder(tokenizer, None, n_window=0), ears))

    def intake(self, *, text_on_loop: bool) -> Intake:
        b = self.cascade.brain
        limits = ReplyLimits(b.max_model_len, b.default_max_tokens, b.sampling, SPEAKERS[self.cascade.voice])
        # the ears run in the prompt's thread: never on the loop
        return Intake(self.info, self.models.prompts, limits, text_on_loop=False)

    def load_core(self) -> EngineCore:
        models, b, profile = self.models, self.cascade.brain, self.profile
        tk = ThinkerConfig(max_batch=b.max_batch, max_model_len=b.max_model_len, default_max_tokens=b.default_max_tokens,
                           sampling=b.sampling)
        metrics, reports = EngineMetrics(), ReportQueue()
        thinker_inbox, speak_inbox = Inbox(), Inbox()
        with torch.inference_mode():
            runner = BrainRunner(models.model, max_batch=tk.max_batch, max_len=tk.max_model_len)
        policy = FirstPacketPolicy(profile.first_packet, profile.async_chunk)
        tokenizer = models.tokenizer
        eos_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")}
        thinker = ThinkerStage(runner, tk, tokenizer, eos_ids, policy, thinker_inbox, speak_inbox.put, reports.put,
                               metrics)
        speak = SpeakStage(models.voice, tokenizer, speak_inbox, reports.put, metrics, runner.device)
        core = Orchestrator(thinker_inbox=thinker_inbox, stages={"thinker": thinker, "speak": speak}, reports=reports,
                            metrics=metrics, speaks=True)
        return TranscribingCore(Gate.for_profile(core, profile.admission, b.max_batch), tokenizer)


def _ears(cascade: CascadeConfig) -> Ears:
    if cascade.ears == "pocketsphinx":
        return SphinxEars.load()
    # one thread is as fast as two for tiny.en; two workers finish overlapping turns sooner (engine/cascade/ears.py)
    return WhisperEars.from_package(cpu_threads=1, workers=2)


def _voice(cascade: CascadeConfig, threads: int) -> Voice:
    if cascade.voice == "festival":
        return FestivalVoice.load()
    return PiperVoice.load(threads=threads)
