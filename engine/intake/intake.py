"""The front door: a request's voice, prompt and reply length decided once, before any engine sees it.

`Intake` turns an `EngineRequest` into an `AdmittedRequest` or refuses it with an `EngineError` that is safe to
show a client; an output constraint becomes its grammar here, so a schema the engine cannot decode under is
refused before any work. It runs in the server's process even when the stages run in another: a refusal is an
error at once, and an accepted request's response starts without a round trip."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from engine.api import AudioPart, EngineError, EngineRequest, ImagePart, ModelInfo, VideoPart
from engine.handoff import AdmittedRequest
from engine.intake.constraints import grammar_for
from engine.intake.prompt import TOOL_CALL_END, TOOL_CALL_START, Prompts
from engine.profile import SamplingConfig


@dataclass(frozen=True, slots=True)
class ReplyLimits:
    """What bounds a reply and how it samples where its request says nothing: its backend's profile."""

    max_model_len: int
    default_max_tokens: int
    sampling: SamplingConfig
    default_speaker: str


def resolve_speaker(request: EngineRequest, default: str, speakers: tuple[str, ...]) -> str:
    """The voice a request speaks in; an error when it wants audio this model cannot give."""
    speaker = (request.speaker or default).lower()
    if request.want_audio:
        if not speakers:
            raise EngineError("this model has no talker: ask for text only")
        if speaker not in speakers:
            raise EngineError(f"unknown voice {request.speaker!r}; available: {', '.join(speakers)}")
    return speaker


def resolve_max_tokens(requested: int | None, cfg: ReplyLimits, prompt_len: int, *, constrained: bool = False) -> int:
    """The profile's default clipped to the context; an explicit limit that does not fit is an error. A constrained
    reply with no limit may run to the end of the context: a cut tool call or JSON object matches no schema."""
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


class Intake:
    """Owns the prompt builder and the limits a request is admitted under. `info`: what its backend can do;
    `constrains`: whether its replies can be decoded under a grammar. `text_on_loop`: text prompts are tokenized
    on the event loop, not in a thread; only where no stage thread shares this process's GIL, since each GIL
    hand-back of the tokenizer would wait on a stage. Audio features always go to a thread."""

    def __init__(self, info: ModelInfo, prompts: Prompts, limits: ReplyLimits, *, text_on_loop: bool,
                 constrains: bool = True) -> None:
        self.info = info
        self.prompts = prompts
        self.limits = limits
        self.text_on_loop = text_on_loop
        self.constrains = constrains
        tokenizer = prompts.tokenizer
        tags = (tokenizer.convert_tokens_to_ids(TOOL_CALL_START), tokenizer.convert_tokens_to_ids(TOOL_CALL_END))
        # a vocabulary without them as tokens (the assistant's) writes the tags as text: its voice drops the calls
        self.tool_call_ids = None if getattr(tokenizer, "unk_token_id", None) in tags or None in tags else tags

    def grammar(self, request: EngineRequest) -> str | None:
        if request.output is None:
            return None
        if not self.constrains:
            raise EngineError("this engine's transformers generate() baseline cannot constrain a reply")
        try:
            return grammar_for(request.output, request.tools, tags_are_tokens=self.tool_call_ids is not None)
        except ValueError as e:
            raise EngineError(f"cannot constrain the reply: {e}", code="invalid_schema") from e

    async def admit(self, request: EngineRequest) -> AdmittedRequest:
        if request.task == "transcribe" and not (
                request.messages and any(isinstance(p, AudioPart) for p in request.messages[-1].content)):
            raise EngineError("a transcription needs audio in its last message")
        speaker = resolve_speaker(request, self.limits.default_speaker, self.info.speakers)
        grammar = self.grammar(request)
        has_media = any(isinstance(p, AudioPart | ImagePart | VideoPart) for m in request.messages for p in m.content)
        if self.text_on_loop and not has_media:
            prompt = self.prompts.build(request.messages, request.tools)
        else:
            prompt = await asyncio.to_thread(self.prompts.build, request.messages, request.tools)
        sp, cfg = request.sampling, self.limits
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
            transcript=prompt.heard if request.task == "transcribe" else None,
            live_turn=request.live_turn,
        )
