"""Input audio transcription: each committed user audio item, transcribed by the Thinker itself, in a text-only
`EngineRequest` of its own beside the reply (system turn: the transcription prompt; user turn: the clip). Its text
streams out as `conversation.item.input_audio_transcription.delta`, then `.completed` (the item's `transcript`
set) or `.failed`. `transcription.model` is echoed, never loaded; `language` and `prompt` join the instruction."""

from __future__ import annotations

import asyncio
import logging
import uuid

import numpy as np

from engine import (
    AudioPart,
    Engine,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
)
from voice_gateway.realtime.conversation import Item
from voice_gateway.realtime.events import (
    ErrorDetail,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    Transcription,
    TranscriptionTokenDetails,
    TranscriptionUsage,
)
from voice_gateway.realtime.sender import EventSender

log = logging.getLogger(__name__)

TRANSCRIBE = "Transcribe the audio exactly: write the words spoken, and nothing else."
# A bound for a model that never stops (a random one does not): speech runs at ~3 words (~4 tokens) a
# second, so twice that is room enough.
_TOKENS_PER_AUDIO_SECOND = 8
_MIN_TOKENS = 16


def instruction(settings: Transcription) -> str:
    text = TRANSCRIBE
    if settings.language:
        text += f" The audio is in the language {settings.language!r}."
    if settings.prompt:
        text += f" Context for the transcript: {settings.prompt}"
    return text


def max_tokens(samples_16k: int) -> int:
    return max(_MIN_TOKENS, samples_16k * _TOKENS_PER_AUDIO_SECOND // 16_000)


def transcription_request(samples: np.ndarray, instruction_text: str, id_prefix: str, *,
                          live_turn: bool) -> EngineRequest:
    """The engine request for the words of `samples` (16 kHz): greedy, bounded by the audio's length. `live_turn`:
    it waits as the session's replies do for a place (`EngineRequest.live_turn`)."""
    return EngineRequest(
        request_id=f"{id_prefix}_{uuid.uuid4().hex[:20]}",
        messages=(Message("system", (TextPart(instruction_text),)), Message("user", (AudioPart(samples),))),
        want_audio=False,
        sampling=SamplingParams(max_tokens=max_tokens(samples.size), temperature=0.0),
        task="transcribe",
        live_turn=live_turn,
    )


class Transcriber:
    """Owns a session's transcriptions in flight: one task per user audio item, until its last event."""

    def __init__(self, engine: Engine, sender: EventSender, session_id: str) -> None:
        self.engine = engine
        self.sender = sender
        self.session_id = session_id
        self.tasks: dict[str, asyncio.Task] = {}

    def start(self, item: Item, settings: Transcription) -> None:
        assert item.audio is not None, item.id
        task = asyncio.create_task(self._run(item, item.audio, settings))
        self.tasks[item.id] = task
        task.add_done_callback(lambda done: self.tasks.pop(item.id, None) if self.tasks.get(item.id) is done else None)

    def cancel(self, item_id: str) -> None:
        task = self.tasks.pop(item_id, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        self.tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, item: Item, samples: np.ndarray, settings: Transcription) -> None:
        # the record of the caller's turn: lost for good if refused, so it waits as the reply does
        request = transcription_request(samples, instruction(settings), "transcribe", live_turn=True)
        try:
            stream = await self.engine.submit(request)
        except EngineError as e:
            self._failed(item, e.code or "transcription_failed", str(e))
            return
        transcript = ""
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    transcript += event.text
                    self.sender.event(InputTranscriptionDelta(item_id=item.id, delta=event.text))
                elif isinstance(event, Finished):
                    t = event.timings
                    item.transcript = transcript
                    usage = TranscriptionUsage(
                        total_tokens=t.prompt_tokens + t.completion_tokens, input_tokens=t.prompt_tokens,
                        output_tokens=t.completion_tokens, input_token_details=TranscriptionTokenDetails(
                            text_tokens=t.prompt_tokens - t.prompt_audio_tokens, audio_tokens=t.prompt_audio_tokens))
                    self.sender.event(InputTranscriptionCompleted(item_id=item.id, transcript=transcript, usage=usage))
                    log.info("session %s: item %s transcribed, %d tokens in, %d out", self.session_id, item.id,
                             t.prompt_tokens, t.completion_tokens)
                    return
                elif isinstance(event, Failed):
                    self._failed(item, event.code or "transcription_failed", event.reason)
                    return
        finally:
            await stream.aclose()

    def _failed(self, item: Item, code: str, message: str) -> None:
        log.info("session %s: transcription of item %s failed (%s): %s", self.session_id, item.id, code, message)
        self.sender.event(InputTranscriptionFailed(item_id=item.id, error=ErrorDetail(
            type="server_error", code=code, message=message)))
