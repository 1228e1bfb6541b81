"""One conversation over WS /v1/realtime: a session set up for a turn mode and an output format, then spoken turns,
each measured by a TurnTimer. A question leaves in `chunk_ms` appends at `input_speed` times real time; the next
question starts once the reply has played out, as for a user who listens to it before asking again, at the same
speed (a long call at 4x plays out in a quarter of its time; each reply is still judged against real-time playback),
after the user's pause if `think_s` asks for one."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import websockets

from bench.config import VoiceConfig
from bench.measure import BYTES_PER_SAMPLE, SAMPLE_RATE
from bench.speech import Question
from bench.turn import REFUSAL_CODES, TurnError, TurnRecord, TurnTimer

# Under server VAD the client streams silence after the question until speech_stopped; past this much it gives up.
MAX_SILENCE_S = 5.0
# Our `response.timing` leaves right behind `response.done`; a server without the extension sends none, and the
# turn goes without the engine's first packet after this long.
TIMING_WAIT_S = 1.0
_GA_FORMATS = {"pcm16": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "opus": {"type": "audio/opus"}}


def session_update(config: VoiceConfig, mode: str, output_format: str) -> dict[str, Any]:
    """The GA `session.update`: audio replies of `max_tokens` text tokens; turn_detection null for manual turns, the
    server VAD for `vad`, and none named for `server` (the server's own default)."""
    audio_in: dict[str, Any] = {"format": _GA_FORMATS["pcm16"]}
    if mode != "server":  # server: its own default stays
        audio_in["turn_detection"] = {"type": "server_vad"} if mode == "vad" else None
    truncation: dict[str, Any] = ({} if config.retention_ratio is None else {
        "truncation": {"type": "retention_ratio", "retention_ratio": config.retention_ratio}})
    return {"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": config.max_tokens,
        "audio": {"input": audio_in, "output": {"format": _GA_FORMATS[output_format]} | _voice(config)}} | truncation}


def _voice(config: VoiceConfig) -> dict[str, str]:
    return {"voice": config.voice} if config.voice else {}  # none named: the server's default


def image_item(image_url: str) -> dict[str, Any]:
    """The GA `conversation.item.create` of a user message whose one part is the picture (a data URL)."""
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": image_url}]}}


def realtime_url(base_url: str, model: str) -> str:
    """The session's URL; `timing=1` asks for our `response.timing` after each spoken reply (the engine's own first
    packet, by part)."""
    ws_url = base_url.rstrip("/").replace("https://", "wss://").replace("http://", "ws://")
    return f"{ws_url}/v1/realtime?model={model}&timing=1"


class _Pacer:
    """Sends audio as a microphone would: the chunk covering [t, t + chunk] leaves at (t + chunk) / speed."""

    def __init__(self, ws: Any, config: VoiceConfig) -> None:
        self.ws, self.speed = ws, config.input_speed
        self.chunk_bytes = config.chunk_ms * SAMPLE_RATE // 1000 * BYTES_PER_SAMPLE
        self.t0 = time.perf_counter()
        self.sent_s = 0.0

    async def send(self, pcm16: bytes) -> None:
        for i in range(0, len(pcm16), self.chunk_bytes):
            chunk = pcm16[i : i + self.chunk_bytes]
            self.sent_s += len(chunk) / BYTES_PER_SAMPLE / SAMPLE_RATE
            await asyncio.sleep(max(0.0, self.t0 + self.sent_s / self.speed - time.perf_counter()))
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(chunk).decode()}))


async def _speak(ws: Any, timer: TurnTimer, question: Question, config: VoiceConfig, image_url: str | None) -> None:
    if image_url:  # the frame goes first, so that the question's audio is asked about it
        await ws.send(json.dumps(image_item(image_url)))
    pacer = _Pacer(ws, config)
    await pacer.send(question.pcm16)
    if not timer.vad:
        timer.input_ended(time.perf_counter())  # just before the commit leaves, as TTFP starts before the request
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        return
    timer.question_sent(time.perf_counter())
    silence = bytes(pacer.chunk_bytes)
    while timer.input_end is None:
        if pacer.sent_s - question.duration_s >= MAX_SILENCE_S:
            raise TurnError(f"no speech_stopped after {MAX_SILENCE_S:.0f} s of silence")
        await pacer.send(silence)


async def _listen(ws: Any, timer: TurnTimer) -> None:
    while not timer.done:
        timer.on_message(await ws.recv(), time.perf_counter())
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(TIMING_WAIT_S):
            while timer.awaits_timing:
                timer.on_message(await ws.recv(), time.perf_counter())


async def _turn(ws: Any, timer: TurnTimer, question: Question, config: VoiceConfig, image_url: str | None) -> None:
    """Speak (after the picture, if any) and listen at once until response.done; the first error of either ends
    both: an `error` event for a picture the server refused fails the turn."""
    tasks = [asyncio.create_task(_speak(ws, timer, question, config, image_url)),
             asyncio.create_task(_listen(ws, timer))]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    timer.finish()


async def _expect(ws: Any, kind: str) -> None:
    """Read until an event of `kind`; an `error` event first is the session's failure."""
    while True:
        message = await ws.recv()
        if isinstance(message, str) and (event := json.loads(message)).get("type") in (kind, "error"):
            if event["type"] == "error":
                err = event.get("error") or {}
                raise TurnError(f"error event: {err.get('code')}: {err.get('message')}", err.get("code"))
            return


def think_pause_s(config: VoiceConfig, index: int, turn: int) -> float:
    """How long session `index`'s user pauses before turn `turn`: uniform in 0-`think_s`, at `input_speed`, the
    same for the same session and turn."""
    return random.Random(f"think:{index}:{turn}").uniform(0.0, config.think_s) / config.input_speed


async def run_session(config: VoiceConfig, model: str, mode: str, output_format: str,
                      questions: Sequence[Question], index: int, turns: int,
                      pictures: Sequence[str] = (), deadline: float = math.inf) -> list[TurnRecord]:
    """Session `index`'s turns (turn t asks question (index + t) % count, after picture t % len(pictures), a data
    URL, when t % config.image_every == 0); one that fails ends the session, and none starts at `deadline`
    (perf_counter) or later."""
    def ask(turn: int) -> Question:
        return questions[(index + turn) % len(questions)]

    def shows(turn: int) -> str | None:
        return pictures[turn % len(pictures)] if pictures and turn % config.image_every == 0 else None

    def record(turn: int) -> TurnRecord:
        return TurnRecord(index, turn, ask(turn).name, ask(turn).duration_s, image=shows(turn) is not None)

    records = [record(0)]  # a session that cannot start fails its first turn
    try:
        async with asyncio.timeout(config.timeout):
            ws = await websockets.connect(realtime_url(config.url, model), open_timeout=None)
        async with ws:
            async with asyncio.timeout(config.timeout):
                await _expect(ws, "session.created")
                await ws.send(json.dumps(session_update(config, mode, output_format)))
                await _expect(ws, "session.updated")
            for turn in range(turns):
                if turn:
                    await asyncio.sleep(think_pause_s(config, index, turn))
                    if time.perf_counter() >= deadline:
                        break
                    records.append(record(turn))
                timer = TurnTimer(records[-1], vad=mode != "commit")
                async with asyncio.timeout(config.timeout):
                    await _turn(ws, timer, ask(turn), config, shows(turn))
                assert timer.input_end is not None, records[-1]
                listened_s = records[-1].played_out_s / config.input_speed
                await asyncio.sleep(max(0.0, timer.input_end + listened_s - time.perf_counter()))
    except TurnError as exc:
        records[-1].error, records[-1].refused = str(exc), exc.code in REFUSAL_CODES
    except TimeoutError:
        records[-1].error = f"no reply within {config.timeout:g} s"
    except (OSError, websockets.WebSocketException, ValueError, KeyError, TypeError) as exc:
        # one broken session must not end the level: its turn is recorded as a failure
        records[-1].error = f"{type(exc).__name__}: {exc}"
    return records
