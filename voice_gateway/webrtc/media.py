"""A WebRTC call's media: the reply as a paced audio track (aiortc encodes it to Opus), the microphone into the session,
and the camera (or a shared screen), whose latest frame joins each of the user's turns as an image."""

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


# a camera frame is kept at most this large (the model sees 400 tokens' worth of pixels at most: 1280x720 is plenty)
CAMERA_MAX_SIDE = 1280
# a frame older than this when a turn ends is not what the user is showing any more (a frozen track, or one muted
# without ending: a static screen share still sends a frame every few seconds)
CAMERA_STALE_S = 5.0


class Camera:
    """Keeps the latest frame of one incoming video track, decoded to RGB only when a turn asks for it."""

    def __init__(self) -> None:
        self._frame: av.VideoFrame | None = None
        self._source: MediaStreamTrack | None = None  # the track the frame came from
        self._at = 0.0
        self.frames = 0

    async def consume(self, track: MediaStreamTrack) -> None:
        """Keeps `track`'s frames until it ends; its last frame goes with it (a stopped camera shows nothing),
        unless another track's frame has come since (a camera switched for a screen mid-call)."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if isinstance(frame, av.VideoFrame):
                    self._frame, self._source, self._at = frame, track, time.monotonic()
                    self.frames += 1
        if self._source is track:
            self._frame = self._source = None

    def latest(self) -> np.ndarray | None:
        """The newest frame as RGB uint8 [height, width, 3], its longer side at most CAMERA_MAX_SIDE; None when no
        frame came in the last CAMERA_STALE_S seconds."""
        frame = self._frame
        if frame is None or time.monotonic() - self._at > CAMERA_STALE_S:
            return None
        scale = min(1.0, CAMERA_MAX_SIDE / max(frame.width, frame.height))
        width, height = max(2, round(frame.width * scale)), max(2, round(frame.height * scale))
        return frame.reformat(width=width, height=height, format="rgb24").to_ndarray()
