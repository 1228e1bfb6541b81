"""The cascade's transcriptions: the ears heard a request's speech while its prompt was built (engine/cascade/
listen.py), so a request for its words is answered with them at once, and no stage runs."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from engine.api import EngineHealth, Finished, TextDelta, Timings
from engine.core import EngineCore, Sink
from engine.handoff import AdmittedRequest


class TranscribingCore:
    """`core`: what runs every other request; `tokenizer`: counts a transcript's words as tokens."""

    def __init__(self, core: EngineCore, tokenizer: Any) -> None:
        self.core = core
        self.registry: CollectorRegistry = core.registry
        self.tokenizer = tokenizer

    async def start(self) -> None:
        await self.core.start()

    async def stop(self) -> None:
        await self.core.stop()

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        heard = request.transcript
        if heard is None:
            self.core.begin(request, sink)
            return
        rid = request.request_id
        words = len(self.tokenizer.encode(heard.text, add_special_tokens=False)) if heard.text else 0
        if heard.text:
            sink(TextDelta(rid, heard.text, ()))
        sink(Finished(rid, "stop", Timings(ttft_s=heard.took_s, ttfp_s=None, total_s=heard.took_s, prompt_tokens=0,
                                           prompt_audio_tokens=0, completion_tokens=words, codec_frames=0,
                                           audio_samples=0)))

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    def stage_load(self) -> dict[str, int]:
        return self.core.stage_load()

    def health(self) -> EngineHealth:
        return self.core.health()
