"""A realtime session over WebRTC (aiortc, the `[webrtc]` extra): one call's peer connection, and the answer to its
SDP offer. The microphone's Opus track feeds the session's VAD and input buffer; replies leave on an Opus track
paced in real time; the `oai-events` data channel carries the WebSocket's JSON events; a video track's newest
frame joins each user turn as an image; a reply cut off while it played is truncated where the track stopped. The
session logic is the WebSocket's: one implementation, two transports."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiortc import MediaStreamTrack, RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from fastapi import Request
from fastapi.responses import Response

from voice_gateway.admission import SessionSlot
from voice_gateway.errors import APIError
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session
from voice_gateway.webrtc.config import WebRTCConfig
from voice_gateway.webrtc.ice import gather_on
from voice_gateway.webrtc.media import Camera, Microphone, ReplyTrack

log = logging.getLogger(__name__)


class Call:
    """One peer connection and its session: owns the tasks that move audio and events, and the session's slot."""

    def __init__(self, calls: set[Call], pc: RTCPeerConnection, session: Session, slot: SessionSlot,
                 cfg: WebRTCConfig, camera: Camera) -> None:
        assert session.track is not None, "a call's session plays audio on a track"
        self.calls = calls
        self.pc = pc
        self.session = session
        self.slot = slot
        self.cfg = cfg
        self.reply = ReplyTrack(session.track)
        self.microphone = Microphone(session)
        self.camera = camera
        self.inbox: asyncio.Queue[str | bytes] = asyncio.Queue()  # one reader keeps the events in order
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def read_events(self) -> None:
        while True:
            await deliver(self.session, await self.inbox.get())

    async def pump_events(self, channel: RTCDataChannel) -> None:
        while (payload := await self.session.outbox.get()) is not None:
            if channel.readyState != "open":
                break
            if isinstance(payload, str):
                channel.send(payload)
                if '"output_audio_buffer.cleared"' in payload or '"response.done"' in payload:
                    await self.truncate_cut()

    async def truncate_cut(self) -> None:
        """A reply cut off mid-play keeps the part of its item that left on the track: the peer cannot count it
        (its level meter and clock drift under load, past the item's audio), the track can. What left was not all
        heard yet (the peer's jitter buffer holds tens of ms), as with a phone's last mark. A reply cut off while
        it was generated is truncated once its response is done, which is when its item takes its words."""
        track = self.session.track
        assert track is not None
        cut = track.cut
        item = self.session.conversation.get(cut.item_id) if cut is not None else None
        if cut is None or (item is not None and item.status == "in_progress"):
            return
        track.cut = None
        if item is None or item.audio_ms <= 0:
            return
        await self.session.handle(ev.ConversationItemTruncate(item_id=cut.item_id, content_index=0,
                                                              audio_end_ms=min(cut.left_ms, item.audio_ms)))

    async def watchdog(self) -> None:
        started = time.monotonic()
        while not self.closed.is_set():
            await asyncio.sleep(1.0)
            now = time.monotonic()
            if self.pc.connectionState != "connected" and now - started > self.cfg.connect_timeout_s:
                log.info("call %s: not connected after %.0f s, closing", self.session.id, self.cfg.connect_timeout_s)
                break
            if now - self.microphone.last_audio_at > self.cfg.idle_timeout_s:
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
        self.calls.discard(self)
        await self.session.close()
        for task in list(self.tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self.reply.stop()
        await self.pc.close()


async def answer(request: Request, slot: SessionSlot) -> Response:
    state = request.app.state
    cfg: WebRTCConfig = state.webrtc
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/sdp":
        raise APIError(415, "send the SDP offer with Content-Type: application/sdp", code="unsupported_media_type")
    offer = (await request.body()).decode(errors="replace")
    if "m=audio" not in offer:
        raise APIError(400, "the offer has no audio section", code="invalid_sdp")

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    dialect = ev.dialect_for(request.headers.get("openai-beta"))
    camera = Camera()
    session = Session(state.engine, state.gateway, dialect, state.gateway_metrics, "webrtc", audio_on_track=True,
                      camera=camera.latest, timing=request.query_params.get("timing") == "1")
    call = Call(state.calls, pc, session, slot, cfg, camera)
    pc.addTrack(call.reply)
    session.open()  # session.created waits in the outbox until the data channel opens

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            call.spawn(call.microphone.consume(track))
        elif track.kind == "video":
            log.info("call %s: receiving video; its newest frame joins each turn", session.id)
            call.spawn(call.camera.consume(track))

    @pc.on("datachannel")
    def on_datachannel(channel: RTCDataChannel) -> None:
        if channel.label != "oai-events":
            return
        channel.on("message", call.inbox.put_nowait)
        call.spawn(call.read_events())
        call.spawn(call.pump_events(channel))

    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        answer = await pc.createAnswer()
        if cfg.host_addresses:
            await gather_on(pc, cfg.host_addresses)
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
