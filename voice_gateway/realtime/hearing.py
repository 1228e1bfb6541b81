"""Hearing a turn before it ends: at each pause of the user's speech, the turn so far is transcribed by the engine,
so that turn detection judges the pause on its words too, and the engine, which keeps each clip's words, has
heard the turn once it ends: its reply starts without waiting for the ears.

Only for an engine that makes speech text before it thinks (`ModelInfo.listens_ahead`): for one that hears audio
itself a transcription would be work the reply does not use."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future

from engine import (
    Engine,
    EngineError,
    Failed,
    Finished,
    TextDelta,
)
from voice_gateway.realtime.input_buffer import InputAudioBuffer
from voice_gateway.realtime.transcription import TRANSCRIBE, transcription_request

log = logging.getLogger(__name__)


class HearingAhead:
    """Reads the session's input `buffer` (never writes it) and asks `engine` for the words of a span of it; owns
    nothing. Made on the session's event loop, whose coroutines `from_thread` schedules."""

    def __init__(self, engine: Engine, buffer: InputAudioBuffer, session_id: str) -> None:
        self.engine = engine
        self.buffer = buffer
        self.session_id = session_id
        self._loop = asyncio.get_running_loop()
        self._heard: dict[int, tuple[float, float]] = {}  # end ms of the latest pause heard -> (began, done) at

    def heard_at(self, end_ms: int) -> tuple[float, float] | None:
        """When the words of the speech up to `end_ms` began to be heard and were (perf_counter), if they were."""
        return self._heard.get(end_ms)

    def from_thread(self, offset_ms: int, padding_ms: int, start_ms: int, end_ms: int) -> Future[str]:
        """For the turn detector's thread: the words of the speech from `start_ms` (less `padding_ms`, as a turn is
        committed) to `end_ms`, on a VAD clock `offset_ms` behind the buffer's."""
        return asyncio.run_coroutine_threadsafe(self.hear(start_ms + offset_ms - padding_ms, end_ms + offset_ms),
                                                self._loop)

    async def hear(self, start_ms: int, end_ms: int) -> str:
        """The words of the buffered audio from `start_ms` to `end_ms` (clock ms), exactly the samples a turn that
        ends at `end_ms` commits; "" if the engine refuses or fails."""
        clip = self.buffer.peek(start_ms, end_ms)
        started = time.perf_counter()
        # not a live turn: the turn detector waits on these words, and a refusal costs only them (it judges the
        # pause on the audio alone), so a quick refusal beats a long wait
        request = transcription_request(clip, TRANSCRIBE, "hear", live_turn=False)
        words = ""
        try:
            stream = await self.engine.submit(request)
            try:
                async for event in stream:
                    if isinstance(event, TextDelta):
                        words += event.text
                    elif isinstance(event, Finished):
                        break
                    elif isinstance(event, Failed):
                        words = ""
                        break
            finally:
                await stream.aclose()
        except EngineError as e:
            log.info("session %s: hearing ahead refused (%s): %s", self.session_id, e.code, e)
            return ""
        self._heard = {end_ms: (started, time.perf_counter())}
        log.info("session %s: heard %d ms of a turn so far in %.0f ms: %r", self.session_id, end_ms - start_ms,
                 1000 * (time.perf_counter() - started), words)
        return words
