"""The staged Qwen3-Omni engine as a backend: a checkpoint's Thinker, Talker and Code2Wav (assemble.py), or
transformers' generate() as the benchmark baseline (reference.py), behind the gate. It takes audio, images and
video and speaks the checkpoint's speakers. Opening it reads the config and tokenizer only; the weights load in
`load_core`, so a server process whose engine runs elsewhere never loads the model's code."""

from __future__ import annotations

from engine.api import ModelInfo
from engine.core import EngineCore
from engine.gate import Gate
from engine.intake.images import ImagePreprocessor
from engine.intake.intake import Intake, ReplyLimits
from engine.intake.prompt import PromptBuilder
from engine.omni.weights.source import ModelSource
from engine.profile import DeployProfile


class OmniBackend:
    """`source`: the checkpoint, opened; `profile`: the stages' settings (`stages.thinker`, `talker`, `code2wav`)."""

    def __init__(self, source: ModelSource, profile: DeployProfile) -> None:
        self.source = source
        self.profile = profile
        self.baseline = profile.backend == "transformers_generate"

    @property
    def info(self) -> ModelInfo:
        tk = self.profile.stages.thinker
        return ModelInfo(
            model_id=self.source.model_id,
            is_random_weights=self.source.is_random_weights,
            description=self.source.description + (" [transformers generate() baseline]" if self.baseline else ""),
            max_model_len=tk.max_model_len,
            speakers=self.source.speakers,
            codec_frame_samples=self.source.frame_samples,
            temperature=tk.sampling.temperature,
            max_image_pixels=tk.image_max_pixels,
        )

    @property
    def capacity(self) -> int:
        """Replies the stages run at once: the smallest batch among them (replicas included)."""
        s = self.profile.stages
        return min(s.thinker.max_batch, s.talker.max_batch * s.talker.copies,
                   s.code2wav.max_batch * s.code2wav.copies)

    def intake(self, *, text_on_loop: bool) -> Intake:
        tk, tc = self.profile.stages.thinker, self.source.config.thinker_config
        images = ImagePreprocessor(tc.vision_config, min_pixels=tk.image_min_pixels, max_pixels=tk.image_max_pixels)
        videos = ImagePreprocessor(tc.vision_config, min_pixels=tk.image_min_pixels,
                                   max_pixels=tk.video_frame_max_pixels)
        prompts = PromptBuilder(self.source.tokenizer(), self.source.feature_extractor(),
                                n_window=tc.audio_config.n_window, images=images, videos=videos,
                                positions_per_second=int(tc.position_id_per_seconds))
        limits = ReplyLimits(tk.max_model_len, tk.default_max_tokens, tk.sampling,
                             self.profile.stages.talker.default_speaker)
        # generate() takes no grammar
        return Intake(self.info, prompts, limits, text_on_loop=text_on_loop, constrains=not self.baseline)

    def load_core(self) -> EngineCore:
        # imported here: only the process that runs the stages loads them, their kernels and transformers' model code
        if self.baseline:
            from engine.omni.reference import ReferenceCore

            return Gate.for_profile(ReferenceCore.load(self.source, self.profile), self.profile.admission, self.capacity)
        from engine.omni.assemble import assemble

        stages = assemble(self.source, self.profile)
        return Gate.for_profile(stages, self.profile.admission, self.capacity, stages.pools)
