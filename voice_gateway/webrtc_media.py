"""A WebRTC call's audio: the reply as a paced media track (aiortc encodes it to Opus), the microphone into the session."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import time

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from engine import INPUT_SAMPLE_RATE_HZ
from voice_gateway.audio.resample import Resampler
from voice_gateway.realtime.audio_sinks import TRACK_FRAME_SAMPLES, TRACK_RATE_HZ, TrackSink
from voice_gateway.realtime.session import Session

_FRAME_S = TRACK_FRAME_SAMPLES / TRACK_RATE_HZ


class ReplyTrack(MediaStreamTrack):
    """The session's `TrackSink` as an audio track: one 20 ms frame per `recv`, on the wall clock, silence between."""

    kind = "audio"

    def __init__(self, sink: TrackSink) -> None:
        super().__init__()
        self.sink = sink
        self._started_at: float | None = None
        self._frames_sent = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        # pace on the wall clock: frame n leaves at start + n * 20 ms, so the far end never bursts
        now = time.monotonic()
        if self._started_at is None:
            self._started_at = now
        wait = self._started_at + self._frames_sent * _FRAME_S - now
        if wait > 0:
            await asyncio.sleep(wait)
        samples = self.sink.next_frame()
        pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)[None, :]
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = TRACK_RATE_HZ
        frame.pts = self._frames_sent * TRACK_FRAME_SAMPLES
        frame.time_base = fractions.Fraction(1, TRACK_RATE_HZ)
        self._frames_sent += 1
        return frame


class Microphone:
    """Feeds one incoming audio track to the session at 16 kHz; remembers when audio last came (idle timeout)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.last_audio_at = time.monotonic()

    async def consume(self, track: MediaStreamTrack) -> None:
        resampler: Resampler | None = None
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):
                    continue
                if resampler is None or frame.sample_rate != resampler.from_hz:
                    resampler = Resampler(frame.sample_rate, INPUT_SAMPLE_RATE_HZ)
                self.last_audio_at = time.monotonic()
                await self.session.append_audio(resampler.process(_to_mono_float(frame)))


def _to_mono_float(frame: av.AudioFrame) -> np.ndarray:
    samples = frame.to_ndarray()
    channels = len(frame.layout.channels)
    # packed formats interleave channels in one row; planar ones keep a row per channel
    samples = samples.reshape(-1, channels).T if frame.format.is_packed else samples
    mono = samples.astype(np.float32).mean(axis=0)
    return mono / 32768.0 if samples.dtype == np.int16 else mono
