"""The front door: a request's voice, prompt and reply length decided once, before any engine sees it.

`Admission` turns an `EngineRequest` into an `AdmittedRequest` (engine/handoff.py) or refuses it
with an `EngineError` that is safe to show a client. An output constraint becomes its grammar here
(engine/constraints.py), so a schema the engine cannot decode under is refused before any work. It runs in the server's process, also when
the engine's stages run in another one: a refusal is an error at once, and an accepted request's
response starts without a round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.api import AudioPart, EngineError, EngineRequest, ImagePart, ModelInfo, VideoPart
from engine.constraints import grammar_for
from engine.handoff import AdmittedRequest
from engine.profile import DeployProfile, ThinkerConfig
from engine.prompt import TOOL_CALL_END, TOOL_CALL_START, PromptBuilder, Prompts
from engine.vision import ImagePreprocessor
from engine.weights.source import ModelSource


def model_info(source: ModelSource, profile: DeployProfile) -> ModelInfo:
    baseline = " [transformers generate() baseline]" if profile.backend == "transformers_generate" else ""
    return ModelInfo(
        model_id=source.model_id,
        is_random_weights=source.is_random_weights,
        description=source.description + baseline,
        max_model_len=profile.stages.thinker.max_model_len,
        speakers=source.speakers,
        codec_frame_samples=source.frame_samples,
        temperature=profile.stages.thinker.sampling.temperature,
        max_image_pixels=profile.stages.thinker.image_max_pixels,
    )


def resolve_speaker(request: EngineRequest, default: str, speakers: tuple[str, ...]) -> str:
    """The voice a request speaks in; an error when it wants audio this model cannot give."""
    speaker = (request.speaker or default).lower()
    if request.want_audio:
        if not speakers:
            raise EngineError("this model has no talker: ask for text only")
        if speaker not in speakers:
            raise EngineError(f"unknown voice {request.speaker!r}; available: {', '.join(speakers)}")
    return speaker


def resolve_max_tokens(requested: int | None, cfg: ThinkerConfig, prompt_len: int, *, constrained: bool = False) -> int:
    """The profile's default clipped to the context; an explicit limit that does not fit is an error.

    A constrained reply with no limit of its own may run to the end of the context: the default reply
    length would cut a tool call or a JSON object short, and a cut one matches no schema."""
    if requested is not None and requested < 1:
        raise EngineError("max_tokens must be at least 1")
    if prompt_len + 1 > cfg.max_model_len:
        raise EngineError(
            f"the prompt is {prompt_len} tokens; this model's context is {cfg.max_model_len} tokens",
            code="context_length_exceeded",
        )
    if requested is None:
        return cfg.max_model_len - prompt_len if constrained else min(cfg.default_max_tokens, cfg.max_model_len - prompt_len)
    if prompt_len + requested > cfg.max_model_len:
        raise EngineError(
            f"the prompt ({prompt_len} tokens) plus max_tokens ({requested}) exceeds this model's "
            f"context of {cfg.max_model_len} tokens",
            code="context_length_exceeded",
        )
    return requested


class Admission:
    """Owns the prompt builder and the limits a request is admitted under.

    `text_on_loop`: text prompts are tokenized on the event loop (a fraction of a millisecond)
    rather than in a thread. Only where no stage thread shares this process's GIL: next to them,
    each GIL hand-back of the tokenizer waits on a stage, and a burst of 64 arrivals then held
    back every response (docs/performance.md). Audio features always go to a thread.
    """

    def __init__(self, info: ModelInfo, profile: DeployProfile, prompts: Prompts, *, text_on_loop: bool,
                 hear: Callable[[AudioPart], str] | None = None) -> None:
        self.info = info
        self.hear = hear  # speech -> its words, where the engine hears before it thinks: `transcribe` requests
        self.thinker = profile.stages.thinker
        self.default_speaker = profile.stages.talker.default_speaker
        self.prompts = prompts
        self.text_on_loop = text_on_loop
        self.constrains = profile.backend != "transformers_generate"  # generate() takes no grammar
        tokenizer = prompts.tokenizer
        tags = (tokenizer.convert_tokens_to_ids(TOOL_CALL_START), tokenizer.convert_tokens_to_ids(TOOL_CALL_END))
        # a vocabulary without them as tokens (the assistant's) writes the tags as text: its voice drops the calls
        self.tool_call_ids = None if getattr(tokenizer, "unk_token_id", None) in tags or None in tags else tags

    @classmethod
    def open(cls, source: ModelSource, profile: DeployProfile, *, text_on_loop: bool) -> Admission:
        thinker, vision = profile.stages.thinker, source.config.thinker_config.vision_config
        images = ImagePreprocessor(vision, min_pixels=thinker.image_min_pixels, max_pixels=thinker.image_max_pixels)
        videos = ImagePreprocessor(vision, min_pixels=thinker.image_min_pixels,
                                   max_pixels=thinker.video_frame_max_pixels)
        tc = source.config.thinker_config
        prompts = PromptBuilder(source.tokenizer(), source.feature_extractor(), n_window=tc.audio_config.n_window,
                                images=images, videos=videos, positions_per_second=int(tc.position_id_per_seconds))
        return cls(model_info(source, profile), profile, prompts, text_on_loop=text_on_loop)

    def grammar(self, request: EngineRequest) -> str | None:
        """The grammar the reply is decoded under, if the request constrains it."""
        if request.output is None:
            return None
        if not self.constrains:
            raise EngineError("this engine's transformers generate() baseline cannot constrain a reply")
        try:
            return grammar_for(request.output, request.tools, tags_are_tokens=self.tool_call_ids is not None)
        except ValueError as e:
            raise EngineError(f"cannot constrain the reply: {e}", code="invalid_schema") from e

    async def admit(self, request: EngineRequest) -> AdmittedRequest:
        speaker = resolve_speaker(request, self.default_speaker, self.info.speakers)
        grammar = self.grammar(request)
        has_media = any(isinstance(p, AudioPart | ImagePart | VideoPart) for m in request.messages for p in m.content)
        if self.text_on_loop and not has_media:
            prompt = self.prompts.build(request.messages, request.tools)
        else:
            prompt = await asyncio.to_thread(self.prompts.build, request.messages, request.tools)
        sp, cfg = request.sampling, self.thinker
        max_tokens = resolve_max_tokens(sp.max_tokens, cfg, len(prompt.token_ids), constrained=grammar is not None)
        return AdmittedRequest(
            request_id=request.request_id,
            token_ids=prompt.token_ids,
            audio_features=prompt.audio_features,
            audio_tokens=prompt.audio_tokens,
            audio_keys=prompt.audio_keys,
            want_audio=request.want_audio,
            speaker=speaker,
            max_tokens=max_tokens,
            temperature=sp.temperature if sp.temperature is not None else cfg.sampling.temperature,
            top_p=sp.top_p if sp.top_p is not None else cfg.sampling.top_p,
            top_k=cfg.sampling.top_k,
            seed=sp.seed,
            grammar=grammar,
            tool_call_ids=self.tool_call_ids if request.tools else None,
            conversation=request.conversation,
            images=prompt.images,
            image_tokens=prompt.image_tokens,
            positions=prompt.positions,
        )
