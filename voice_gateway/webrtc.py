"""POST /v1/realtime/calls: a realtime session over WebRTC (aiortc).

SDP offer in, SDP answer out. The browser's microphone arrives as an Opus RTP
track and feeds the session's VAD and input buffer; replies leave on an Opus
track paced in real time; the `oai-events` data channel carries the same JSON
events as the WebSocket. The session logic is the WebSocket's: one
implementation, two transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections import deque
from dataclasses import dataclass

import av
import numpy as np
import soxr
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine import INPUT_SAMPLE_RATE_HZ
from voice_gateway.admission import Refused, SessionSlot
from voice_gateway.errors import APIError
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.session import Session

log = logging.getLogger(__name__)
router = APIRouter()

TRACK_RATE_HZ = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
_FRAME_S = FRAME_SAMPLES / TRACK_RATE_HZ


@dataclass(frozen=True, slots=True)
class WebRTCConfig:
    # aioice offers host candidates on every interface but loopback; a deployment (or a test in
    # its own network namespace) that must stay on given addresses names them here.
    host_addresses: tuple[str, ...] = ()
    connect_timeout_s: float = 20.0  # ICE + DTLS must be up by then
    idle_timeout_s: float = 120.0  # no microphone audio for this long closes the call


class ReplyTrack(MediaStreamTrack):
    """The reply as an audio track: 20 ms frames in real time, silence between replies.

    `push` queues reply audio (24 kHz); `clear` drops whatever has not been sent yet.
    """

    kind = "audio"

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self._queue: deque[np.ndarray] = deque()
        self._pending = np.zeros(0, np.float32)
        self._resampler = soxr.ResampleStream(24_000, TRACK_RATE_HZ, 1, dtype="float32", quality="HQ")
        self._started_at: float | None = None
        self._frames_sent = 0
        self.playing: str | None = None  # response id whose audio is on the wire
        self.last_response: str | None = None

    def push(self, samples: np.ndarray, response_id: str) -> None:
        if response_id != self.last_response:
            self._resampler.clear()
            self.last_response = response_id
        wide = self._resampler.resample_chunk(samples.astype(np.float32))
        self._queue.append(wide)

    def clear(self) -> None:
        self._queue.clear()
        self._pending = np.zeros(0, np.float32)
        self.playing = None

    def _next_samples(self) -> np.ndarray:
        while self._pending.size < FRAME_SAMPLES and self._queue:
            self._pending = np.concatenate([self._pending, self._queue.popleft()])
        frame, self._pending = self._pending[:FRAME_SAMPLES], self._pending[FRAME_SAMPLES:]
        return frame

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
        samples = self._next_samples()
        self._track_playback(samples.size > 0)
        if samples.size < FRAME_SAMPLES:
            samples = np.concatenate([samples, np.zeros(FRAME_SAMPLES - samples.size, np.float32)])
        pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)[None, :]
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = TRACK_RATE_HZ
        frame.pts = self._frames_sent * FRAME_SAMPLES
        frame.time_base = fractions.Fraction(1, TRACK_RATE_HZ)
        self._frames_sent += 1
        return frame

    def _track_playback(self, has_audio: bool) -> None:
        if has_audio and self.playing is None and self.last_response is not None:
            self.playing = self.last_response
            self.session.send(ev.OutputAudioBufferStarted(response_id=self.playing))
        elif not has_audio and self.playing is not None and self.session.response is None:
            self.session.send(ev.OutputAudioBufferStopped(response_id=self.playing))
            self.playing = None


class Call:
    """One peer connection and its session: owns the tasks that move audio and events."""

    def __init__(self, request: Request, pc: RTCPeerConnection, session: Session, slot: SessionSlot,
                 cfg: WebRTCConfig) -> None:
        self.app = request.app
        self.pc = pc
        self.slot = slot
        self.session = session
        self.cfg = cfg
        self.reply = ReplyTrack(session)
        session.audio_out = self.reply
        self.tasks: set[asyncio.Task] = set()
        self.last_audio_at = time.monotonic()
        self.closed = asyncio.Event()

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def consume_microphone(self, track: MediaStreamTrack) -> None:
        resampler: soxr.ResampleStream | None = None
        rate = 0
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                mono = _to_mono_float(frame)
                if frame.sample_rate != rate:
                    rate = frame.sample_rate
                    resampler = soxr.ResampleStream(rate, INPUT_SAMPLE_RATE_HZ, 1, dtype="float32", quality="HQ")
                assert resampler is not None
                self.last_audio_at = time.monotonic()
                await self.session.append_audio(resampler.resample_chunk(mono))

    async def pump_events(self, channel) -> None:
        while (payload := await self.session.outbox.get()) is not None:
            if channel.readyState != "open":
                break
            if isinstance(payload, str):
                channel.send(payload)

    async def watchdog(self) -> None:
        started = time.monotonic()
        while not self.closed.is_set():
            await asyncio.sleep(1.0)
            now = time.monotonic()
            if self.pc.connectionState != "connected" and now - started > self.cfg.connect_timeout_s:
                log.info("call %s: not connected after %.0f s, closing", self.session.id, self.cfg.connect_timeout_s)
                break
            if now - self.last_audio_at > self.cfg.idle_timeout_s:
                log.info("call %s: no microphone audio for %.0f s, closing", self.session.id, self.cfg.idle_timeout_s)
                break
            if now - started > self.session.gateway.max_session_s:
                self.session.error("session_expired", "the session reached its maximum length")
                break
        await self.close()

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self.slot.release()
        self.app.state.calls.discard(self)
        await self.session.close()
        for task in list(self.tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self.reply.stop()
        await self.pc.close()


def _to_mono_float(frame: av.AudioFrame) -> np.ndarray:
    samples = frame.to_ndarray()
    channels = len(frame.layout.channels)
    # packed formats interleave channels in one row; planar ones keep a row per channel
    samples = samples.reshape(-1, channels).T if frame.format.is_packed else samples
    mono = samples.astype(np.float32).mean(axis=0)
    return mono / 32768.0 if samples.dtype == np.int16 else mono


async def _gather_on(pc: RTCPeerConnection, addresses: tuple[str, ...]) -> None:
    """Gather host candidates on exactly `addresses` (aioice would skip loopback)."""
    gatherers = {t.sender.transport.transport.iceGatherer for t in pc.getTransceivers() if t.sender.transport}
    if pc.sctp is not None:
        gatherers.add(pc.sctp.transport.transport.iceGatherer)
    for gatherer in gatherers:
        connection = gatherer._connection
        if connection._local_candidates_start:
            continue
        connection._local_candidates_start = True
        for component in connection._components:
            connection._local_candidates += await connection.get_component_candidates(
                component=component, addresses=list(addresses)
            )
        connection._local_candidates_end = True


@router.post("/v1/realtime/calls")
async def create_call(request: Request, model: str | None = None) -> Response:
    try:
        slot = request.app.state.admission.admit("webrtc", request.headers.get("authorization"), (), model)
    except Refused as refused:
        raise refused.as_api_error() from None
    try:
        return await _answer(request, slot)
    except BaseException:
        slot.release()  # a refused offer was never a session; an answered one releases in Call.close
        raise


async def _answer(request: Request, slot: SessionSlot) -> Response:
    state = request.app.state
    gateway, engine, metrics, cfg = state.gateway, state.engine, state.gateway_metrics, state.webrtc
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/sdp":
        raise APIError(415, "send the SDP offer with Content-Type: application/sdp", code="unsupported_media_type")
    offer = (await request.body()).decode(errors="replace")
    if "m=audio" not in offer:
        raise APIError(400, "the offer has no audio section", code="invalid_sdp")

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    session = Session(engine, gateway, ev.dialect_for(request.headers.get("openai-beta")), metrics, "webrtc")
    call = Call(request, pc, session, slot, cfg)
    pc.addTrack(call.reply)
    session.open()  # session.created waits in the outbox until the data channel opens

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            call.spawn(call.consume_microphone(track))

    @pc.on("datachannel")
    def on_datachannel(channel) -> None:
        if channel.label != "oai-events":
            return

        @channel.on("message")
        def on_message(message) -> None:
            call.spawn(session.handle(message))

        call.spawn(call.pump_events(channel))

    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        answer = await pc.createAnswer()
        if cfg.host_addresses:
            await _gather_on(pc, cfg.host_addresses)
        await pc.setLocalDescription(answer)
    # aiortc's SDP parser raises ValueError on missing fields, and asserts on lines it cannot split
    except (ValueError, AttributeError, AssertionError) as e:
        await session.close()
        await pc.close()
        raise APIError(400, f"could not use the SDP offer: {e}", code="invalid_sdp") from e

    # only now: a refused offer's pc.close() must not close a call that never began
    @pc.on("connectionstatechange")
    async def on_state() -> None:
        log.info("call %s: peer connection %s", session.id, pc.connectionState)
        if pc.connectionState in ("failed", "closed"):
            await call.close()

    state.calls.add(call)
    call.spawn(call.watchdog())
    log.info("call %s: answered", session.id)
    return Response(pc.localDescription.sdp, status_code=201, media_type="application/sdp",
                    headers={"Location": f"/v1/realtime/calls/{session.id}"})
