"""Client-side measurement of one spoken turn of a realtime session: the per-turn record, and folding the
server's messages (JSON events, binary Opus packets) into it. Times are seconds from the end of the user's input
(DESIGN.md section 7): the `input_audio_buffer.commit` sent, or `speech_stopped` received under server VAD."""

from __future__ import annotations

import base64
import json
import struct
import time
from dataclasses import dataclass
from typing import Any

from bench.measure import BYTES_PER_SAMPLE, SAMPLE_RATE, scheduled_underruns

# Our Opus extension's binary message (voice_gateway/audio/opus.py): three big-endian u32 (sequence, 48 kHz
# timestamp, sample_offset in 24 kHz samples of the reply, restarting at 0 each response), then one 20 ms packet.
OPUS_HEADER = struct.Struct(">III")
OPUS_PACKET_SAMPLES = 480  # 20 ms at 24 kHz: the sample_offset step
# Error codes that are the server saying "not now" (sessions full, engine queue full or down): refusals, not failures.
REFUSAL_CODES = frozenset({"too_many_sessions", "server_overloaded", "engine_unavailable"})


class TurnError(RuntimeError):
    """The turn cannot complete: an `error` event, a failed response, or the audio was not taken as one turn."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class TurnRecord:
    session: int  # which conversation of the level
    turn: int  # 0-based place in it: its history is this many earlier turns
    question: str
    speech_s: float  # the question's audio
    image: bool = False  # the turn sent the picture (--image) as a user item before its question
    ok: bool = False
    refused: bool = False  # see REFUSAL_CODES
    error: str | None = None
    status: str | None = None  # response.done's status
    vad_wait_s: float | None = None  # server VAD: last speech chunk sent -> speech_stopped (the silence window)
    first_audio_s: float | None = None  # input end -> first audio delta or Opus packet: the spoken-turn latency
    # turn detection on the server: the question's last chunk sent -> first audio, the wait the user hears (the
    # turn decision, vad_wait_s, included)
    speech_end_s: float | None = None
    done_s: float | None = None  # input end -> response.done
    audio_s: float = 0.0  # reply audio received
    pieces: int = 0  # audio deltas or Opus packets
    offset_errors: int = 0  # Opus packets whose sample_offset is not where the one before ended
    underruns: int = 0
    stall_ms: float = 0.0
    input_tokens: int | None = None  # response.done usage: the conversation so far, as the server counted it
    cached_tokens: int | None = None  # of those, the ones a cached prefix held (not prefilled again)
    image_tokens: int | None = None  # of those, the pictures': every image the conversation still holds
    audio_frames: int | None = None  # usage.output_token_details.audio_tokens: codec frames
    # our `response.timing` extension: the engine's own first packet (its request -> its first packet, on its
    # clock) and where it went, part by part (queued, thinker, talker_prefill, talker_frames, code2wav; they add up
    # to it); None from a server or engine that does not report them
    engine_first_packet_s: float | None = None
    first_packet_parts_s: dict[str, float] | None = None
    ended_at: float | None = None  # time.time() at response.done: where the turn falls in the level (bench/timeline.py)

    @property
    def played_out_s(self) -> float:
        """When a player that started at the first audio has played all of it, with its stalls (0: no audio)."""
        return (self.first_audio_s or 0.0) + self.audio_s + self.stall_ms / 1000.0


class TurnTimer:
    """Folds one turn's timestamped server messages into its TurnRecord (times are perf_counter seconds).

    Under server VAD the input ends when `speech_stopped` arrives (the client says when the question's last chunk
    left: `question_sent`); with manual turns the client says when it sent the commit (`input_ended`). A session
    opened with `?timing=1` gets `response.timing` right after a spoken reply's `response.done`: until it comes,
    `awaits_timing` says so (a server without the extension never sends it, so the listener waits a while only)."""

    def __init__(self, record: TurnRecord, vad: bool) -> None:
        self.record, self.vad = record, vad
        self.input_end: float | None = None
        self._question_sent: float | None = None
        self.done = False
        self._pieces: list[tuple[float, float]] = []  # (arrival, start s in the reply) of each piece of audio
        self._pcm_s = 0.0
        self._next_offset = 0
        self._t_done: float | None = None
        self._response_id: str | None = None  # response.done's
        self._timed = False

    def input_ended(self, now: float) -> None:
        self.input_end = now

    def question_sent(self, now: float) -> None:
        self._question_sent = now  # under server VAD the silence starts here

    def on_message(self, message: str | bytes, now: float) -> None:
        if isinstance(message, bytes):
            self._on_packet(message, now)
        else:
            self._on_event(json.loads(message), now)

    def _on_event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        if kind == "error":
            err = event.get("error") or {}
            raise TurnError(f"error event: {err.get('code')}: {err.get('message')}", err.get("code"))
        if kind == "input_audio_buffer.speech_stopped" and self.vad and self.input_end is None:
            if self._question_sent is None:
                raise TurnError("server VAD ended the turn before the question had been sent")
            self.input_end, self.record.vad_wait_s = now, now - self._question_sent
        elif kind == "response.output_audio.delta":
            seconds = len(base64.b64decode(event["delta"])) / BYTES_PER_SAMPLE / SAMPLE_RATE
            self._piece(now, self._pcm_s, seconds)
            self._pcm_s += seconds
        elif kind == "response.done":
            self._on_done(event["response"], now)
        elif kind == "response.timing" and self.done and event.get("response_id") == self._response_id:
            self._on_timing(event)  # one for an earlier turn's reply, late, is not this one's

    def _on_packet(self, data: bytes, now: float) -> None:
        if len(data) <= OPUS_HEADER.size:
            raise TurnError(f"a binary message of {len(data)} B is no Opus packet")
        _, _, offset = OPUS_HEADER.unpack_from(data)
        if offset != self._next_offset:
            self.record.offset_errors += 1
        self._next_offset = offset + OPUS_PACKET_SAMPLES
        # the player schedules each packet by its own offset: a gap or a repeat shows up as lateness
        self._piece(now, offset / SAMPLE_RATE, OPUS_PACKET_SAMPLES / SAMPLE_RATE)

    def _piece(self, now: float, start_s: float, seconds: float) -> None:
        if self.input_end is None:
            raise TurnError("reply audio arrived before the input ended")
        self._pieces.append((now, start_s))
        self.record.audio_s = max(self.record.audio_s, start_s + seconds)

    def _on_done(self, response: dict[str, Any], now: float) -> None:
        rec = self.record
        self.done, self._t_done, self._response_id = True, now, response.get("id")
        self.record.ended_at = time.time()
        rec.status = response.get("status")
        usage = response.get("usage") or {}
        rec.input_tokens = usage.get("input_tokens")
        details = usage.get("input_token_details") or {}
        rec.cached_tokens, rec.image_tokens = details.get("cached_tokens"), details.get("image_tokens")
        rec.audio_frames = (usage.get("output_token_details") or {}).get("audio_tokens")
        if rec.status != "completed":
            error = ((response.get("status_details") or {}).get("error")) or {}
            raise TurnError(f"response {rec.status}: {error.get('code')}: {error.get('message')}", error.get("code"))

    def _on_timing(self, event: dict[str, Any]) -> None:
        self._timed = True
        if (engine_ms := event.get("engine_first_packet_ms")) is not None:
            self.record.engine_first_packet_s = engine_ms / 1000
        if parts := event.get("first_packet_parts_ms"):
            self.record.first_packet_parts_s = {name.removesuffix("_ms"): ms / 1000 for name, ms in parts.items()}

    @property
    def awaits_timing(self) -> bool:
        """The reply is done and spoke, and its `response.timing` has not come (yet)."""
        return self.done and not self._timed and self.record.status == "completed" and bool(self._pieces)

    def finish(self) -> None:
        """Fill in the record's times once response.done has arrived; a reply without audio is a failure."""
        rec = self.record
        assert self.done and self.input_end is not None and self._t_done is not None, "finish before response.done"
        rec.done_s = self._t_done - self.input_end
        rec.pieces = len(self._pieces)
        if not self._pieces:
            raise TurnError("the reply carried no audio")
        rec.first_audio_s = self._pieces[0][0] - self.input_end
        if self._question_sent is not None:
            rec.speech_end_s = self._pieces[0][0] - self._question_sent
        rec.underruns, rec.stall_ms = scheduled_underruns(self._pieces)
        rec.ok = True
