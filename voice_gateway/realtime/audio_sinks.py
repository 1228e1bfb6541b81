"""Where a session's reply audio goes: one sink per output format, chosen once, fed 24 kHz float32 by the runner.

PCM16 and G.711 leave as `response.output_audio.delta` events, Opus as binary packets (our extension), and a
WebRTC call's audio as 20 ms frames that its media track pulls in real time. A response's audio is
`begin` -> `write`* -> `finish` (all of it was written: send what is buffered), or `cancel` (drop what has
not left yet). `write` and `finish` return the outbox's `Delivery`: SLOW_CONSUMER when the client does not
read fast enough (what follows a refused message is not sent).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine import SAMPLE_RATE_HZ
from voice_gateway.audio.g711 import G711_SAMPLE_RATE_HZ, alaw_encode, ulaw_encode
from voice_gateway.audio.opus import OpusPacket, OpusStream
from voice_gateway.audio.resample import Resampler
from voice_gateway.audio.wav import float_to_pcm16
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.outbox import Delivery
from voice_gateway.realtime.sender import EventSender

TRACK_RATE_HZ = 48_000
TRACK_FRAME_SAMPLES = 960  # 20 ms at 48 kHz


class AudioSink(Protocol):
    def begin(self, response_id: str, item_id: str) -> None: ...

    def write(self, samples: np.ndarray) -> Delivery: ...

    def finish(self) -> Delivery: ...

    def cancel(self) -> int:
        """Drop the current response's audio that has not left; returns how many queued messages went."""
        ...


class _EventSink:
    """Shared by the event formats: which response is writing, and dropping its queued audio on cancel."""

    def __init__(self, sender: EventSender) -> None:
        self.sender = sender
        self.response_id = ""
        self.item_id = ""

    def begin(self, response_id: str, item_id: str) -> None:
        self.response_id, self.item_id = response_id, item_id

    def _delta(self, data: bytes) -> Delivery:
        delta = ev.OutputAudioDelta(response_id=self.response_id, item_id=self.item_id, delta=data)
        return self.sender.event(delta, self.response_id)

    def finish(self) -> Delivery:
        return Delivery.QUEUED

    def cancel(self) -> int:
        return self.sender.drop(self.response_id)


class Pcm16Sink(_EventSink):
    """`response.output_audio.delta` events of 16-bit little-endian PCM at 24 kHz (OpenAI's default)."""

    def write(self, samples: np.ndarray) -> Delivery:
        return self._delta(float_to_pcm16(samples))


class G711Sink(_EventSink):
    """`response.output_audio.delta` events of µ-law or A-law at 8 kHz; a stream resampler per response."""

    def __init__(self, sender: EventSender, encode: Callable[[np.ndarray], bytes]) -> None:
        super().__init__(sender)
        self._encode = encode
        self._resampler = Resampler(SAMPLE_RATE_HZ, G711_SAMPLE_RATE_HZ)

    def begin(self, response_id: str, item_id: str) -> None:
        super().begin(response_id, item_id)
        self._resampler.reset()

    def write(self, samples: np.ndarray) -> Delivery:
        return self._delta(self._encode(self._resampler.process(samples)))


class OpusSink(_EventSink):
    """Binary messages of one 20 ms Opus packet each (`audio/opus.py` frames them); counters run across responses."""

    def __init__(self, sender: EventSender, bitrate_bps: int) -> None:
        super().__init__(sender)
        self._opus = OpusStream(bitrate_bps=bitrate_bps)

    def begin(self, response_id: str, item_id: str) -> None:
        super().begin(response_id, item_id)
        self._opus.start_response()  # drops a cancelled response's partial frame

    def write(self, samples: np.ndarray) -> Delivery:
        return self._send(self._opus.encode(samples))

    def finish(self) -> Delivery:
        return self._send(self._opus.flush())

    def _send(self, packets: list[OpusPacket]) -> Delivery:
        for packet in packets:
            if (delivery := self.sender.binary(packet.pack(), self.response_id)) is not Delivery.QUEUED:
                return delivery
        return Delivery.QUEUED


def event_sink(fmt: ev.AudioFormat, sender: EventSender, opus_bitrate_bps: int) -> AudioSink:
    if fmt is ev.AudioFormat.OPUS:
        return OpusSink(sender, opus_bitrate_bps)
    if fmt is ev.AudioFormat.G711_ULAW:
        return G711Sink(sender, ulaw_encode)
    if fmt is ev.AudioFormat.G711_ALAW:
        return G711Sink(sender, alaw_encode)
    return Pcm16Sink(sender)


@dataclass(frozen=True, slots=True)
class PlayedCut:
    """A response cut off while it played: `left_ms` of its item's audio had left on the track."""

    item_id: str
    left_ms: int


class TrackSink:
    """A call's reply audio, queued at `rate_hz` (48 kHz for a WebRTC track, 8 kHz for a phone line) for its transport
    to pull as 20 ms frames. Owns the queue and which response is on the wire (`playing`, and the item it speaks):
    `output_audio_buffer.started` when a response's first frame leaves, `.stopped` once a finished response has
    played out; cancel empties the queue at once, and where it cut a response off mid-play, `cut` says how much of
    its item had left (a WebRTC call truncates the item there: the server, not the peer, knows what it sent)."""

    def __init__(self, sender: EventSender, rate_hz: int = TRACK_RATE_HZ) -> None:
        self.sender = sender
        self.rate_hz = rate_hz
        self.frame_samples = rate_hz // 50  # 20 ms
        self.playing: str | None = None
        self._item_ids: dict[str, str] = {}  # response id -> its assistant item, while queued or playing
        self._queue: deque[tuple[str, np.ndarray]] = deque()
        self._pending = np.zeros(0, np.float32)
        self._pending_id: str | None = None
        self._writing: str | None = None
        self._finished: set[str] = set()  # responses whose audio is all queued
        self._resampler = Resampler(SAMPLE_RATE_HZ, rate_hz)
        self._left = 0  # samples of `playing` that have left
        self.cut: PlayedCut | None = None  # the last response cancel cut off while it played

    def begin(self, response_id: str, item_id: str) -> None:
        self._writing = response_id
        self._item_ids[response_id] = item_id
        self._resampler.reset()

    @property
    def has_audio(self) -> bool:
        """Whether reply audio waits to leave (a phone line sends no silence between replies)."""
        return self._pending.size > 0 or bool(self._queue)

    def item_of(self, response_id: str) -> str | None:
        """The assistant item whose audio `response_id` plays."""
        return self._item_ids.get(response_id)

    def write(self, samples: np.ndarray) -> Delivery:
        assert self._writing is not None, "write before begin"
        self._queue.append((self._writing, self._resampler.process(samples)))
        return Delivery.QUEUED  # the track pulls in real time: its queue is the reply, not the client's backlog

    def finish(self) -> Delivery:
        if self._writing is not None:
            # the resampler holds back its filter's delay until told the stream ends
            tail = self._resampler.flush()
            self._queue.append((self._writing, tail))
            self._finished.add(self._writing)
        return Delivery.QUEUED

    def cancel(self) -> int:
        dropped = len(self._queue) + (self._pending.size > 0)
        item_id = self._item_ids.get(self.playing) if self.playing is not None else None
        if item_id is not None:
            self.cut = PlayedCut(item_id, self._left * 1000 // self.rate_hz)
        self._queue.clear()
        self._pending, self._pending_id = np.zeros(0, np.float32), None
        self._finished.clear()
        self._item_ids = {r: i for r, i in self._item_ids.items() if r == self._writing}
        self.playing = None
        return dropped

    def next_frame(self) -> np.ndarray:
        """The next 20 ms at `rate_hz`, float32, padded with silence when the queue runs short."""
        n = self.frame_samples
        frame_id = self._pending_id if self._pending.size else (self._queue[0][0] if self._queue else None)
        while self._pending.size < n and self._queue:
            self._pending_id, chunk = self._queue.popleft()
            self._pending = np.concatenate([self._pending, chunk])
        frame, self._pending = self._pending[:n], self._pending[n:]
        self._note_playback(frame_id if frame.size else None)
        self._left += frame.size
        if frame.size < n:
            frame = np.concatenate([frame, np.zeros(n - frame.size, np.float32)])
        return frame

    def _note_playback(self, response_id: str | None) -> None:
        if response_id is not None and response_id != self.playing:
            self._stopped()
            self.playing, self._left = response_id, 0
            self.sender.event(ev.OutputAudioBufferStarted(response_id=response_id))
        elif response_id is None and self.playing in self._finished:
            self._stopped()  # an unfinished response that runs short is still playing: more audio is coming

    def _stopped(self) -> None:
        if self.playing is not None:
            self._finished.discard(self.playing)
            if self.playing != self._writing:
                self._item_ids.pop(self.playing, None)
            self.sender.event(ev.OutputAudioBufferStopped(response_id=self.playing))
            self.playing = None
