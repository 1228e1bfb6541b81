"""A phone call: one carrier media stream driving an ordinary realtime `Session`, and the sidebands attached to it.

The caller's µ-law goes to the session at 16 kHz (its VAD and turn detection are the WebSocket's); replies leave
through the session's 8 kHz track, paced by `Playout`. The session's events, which no phone reads, go to each
attached sideband, and the call acts on three of them: a speech start during a reply (barge-in: `clear`, then the
item truncated at what was heard), and the model's calls of `end_call` and `transfer_call`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Coroutine
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from engine import INPUT_SAMPLE_RATE_HZ
from voice_gateway.admission import SessionSlot
from voice_gateway.audio.g711 import G711_SAMPLE_RATE_HZ, ulaw_decode
from voice_gateway.audio.resample import Resampler
from voice_gateway.phone.book import CallBook
from voice_gateway.phone.config import PhoneConfig
from voice_gateway.phone.control import CarrierControl
from voice_gateway.phone.dialects import CarrierError, Dialect, Dtmf, MarkEcho, Media, Start, Stop, parse
from voice_gateway.phone.playout import Playout
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session

log = logging.getLogger(__name__)

CLOSE_NORMAL, CLOSE_BAD_DATA, CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_ERROR = 1000, 1007, 1008, 1009, 1011
# A carrier that takes longer than this to take one frame, or to echo a mark, has stopped reading (or playing).
_SEND_TIMEOUT_S = 5.0
_WATCH_S = 1.0
_DRAIN_BEFORE_HANGUP_S = 15.0  # the goodbye plays out before the line is cut, for at most this long


class CallEnded(Exception):
    """The stream ends: `code` and `reason` are what its close says."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class PhoneCall:
    """Owns one call's stream socket, its session and slot, its playout, the tasks moving audio and events, and the
    queues of the sidebands attached to it."""

    def __init__(self, ws: WebSocket, session: Session, slot: SessionSlot, dialect: Dialect, start: Start,
                 cfg: PhoneConfig, call_tools: frozenset[str], control: CarrierControl, book: CallBook) -> None:
        """`call_tools`: the built-in tools (`end_call`, `transfer_call`) whose calls this call acts on."""
        assert session.track is not None, "a phone call's session plays its replies on a track"
        self.ws = ws
        self.session = session
        self.slot = slot
        self.dialect = dialect
        self.call_id = start.call_id
        self.cfg = cfg
        self.call_tools = call_tools
        self.control = control
        self.book = book
        self.playout = Playout(session.track, dialect, start.stream_id, self._send, cfg.lead_ms, start.call_id)
        self._resampler = Resampler(G711_SAMPLE_RATE_HZ, INPUT_SAMPLE_RATE_HZ)
        self._send_lock = asyncio.Lock()  # the playout and the call's own messages share one socket
        self.sidebands: set[asyncio.Queue[str | None]] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.ended = asyncio.Event()
        self._end: CallEnded | None = None

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        """The call from its `start` to its end; returns once everything it held is back."""
        self.book.go_live(self)
        log.info("call %s: stream started (%s, session %s)", self.call_id, self.dialect.name, self.session.id)
        self.spawn(self._guard(self.playout.run()))
        self.spawn(self._guard(self._pump()))
        self.spawn(self._guard(self._read()))
        self.spawn(self._guard(self._watch()))
        try:
            async with asyncio.timeout(self.session.gateway.max_session_s):
                await self.ended.wait()
        except TimeoutError:
            self._finish(CallEnded(CLOSE_NORMAL, "the call reached the session's maximum length"))
        await self._close()

    def _finish(self, end: CallEnded) -> None:
        if self._end is None:
            self._end = end
            self.ended.set()

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except CallEnded as end:
            self._finish(end)
        except WebSocketDisconnect:
            self._finish(CallEnded(CLOSE_NORMAL, "the carrier closed the stream"))
        except Exception:
            log.exception("call %s: failed", self.call_id)
            self._finish(CallEnded(CLOSE_ERROR, "internal error"))

    async def _send(self, text: str) -> None:
        try:
            async with self._send_lock:
                await asyncio.wait_for(self.ws.send_text(text), _SEND_TIMEOUT_S)
        except TimeoutError:
            log.warning("call %s: the carrier took no frame for %.0f s, closing", self.call_id, _SEND_TIMEOUT_S)
            raise CallEnded(CLOSE_POLICY, "the carrier stopped reading") from None

    async def _watch(self) -> None:
        """Sends can stall unseen (a send that never returns, or the kernel's buffers taking all): the marks tell."""
        while True:
            await asyncio.sleep(_WATCH_S)
            if self.playout.unechoed_s > _SEND_TIMEOUT_S:
                log.warning("call %s: the carrier took no frame (no mark echoed for %.0f s), closing", self.call_id,
                            _SEND_TIMEOUT_S)
                raise CallEnded(CLOSE_POLICY, "the carrier stopped reading")

    # -- from the carrier
    async def _read(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                raise CallEnded(CLOSE_NORMAL, "the carrier closed the stream")
            raw = message.get("text") or message.get("bytes") or b""
            if len(raw) > self.cfg.max_frame_bytes:
                log.warning("call %s: a %d-byte frame, over the %d limit: closing", self.call_id, len(raw),
                            self.cfg.max_frame_bytes)
                raise CallEnded(CLOSE_TOO_BIG, "frame too large")
            try:
                msg = parse(self.dialect, raw)
            except CarrierError as e:
                log.warning("call %s: protocol error: %s", self.call_id, e)
                raise CallEnded(CLOSE_BAD_DATA, str(e)[:120]) from None
            if isinstance(msg, Media):
                await self.session.append_audio(self._resampler.process(ulaw_decode(msg.ulaw)))
            elif isinstance(msg, MarkEcho):
                self.playout.echoed(msg.name)
            elif isinstance(msg, Dtmf):
                await self._dtmf(msg.digit)
            elif isinstance(msg, Stop):
                raise CallEnded(CLOSE_NORMAL, "the carrier stopped the stream")
            elif isinstance(msg, Start):
                log.warning("call %s: a second start", self.call_id)
                raise CallEnded(CLOSE_POLICY, "one start per stream")

    async def _dtmf(self, digit: str) -> None:
        log.info("call %s: DTMF %s", self.call_id, digit)
        self.session.sender.event(ev.DtmfEventReceived(event=digit, received_at=int(time.time())))
        if self.cfg.dtmf_items:
            item = {"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": f"The caller pressed the {digit} key."}]}
            await self.session.handle(ev.parse_client_event(json.dumps({"type": "conversation.item.create",
                                                                        "item": item})))

    # -- from the session
    async def _pump(self) -> None:
        """Every session event to the sidebands; barge-in and the call tools acted on."""
        while (payload := await self.session.outbox.get()) is not None:
            if not isinstance(payload, str):
                continue
            for queue in list(self.sidebands):
                if queue.full():
                    log.warning("call %s: a sideband does not read; detaching it", self.call_id)
                    self.sidebands.discard(queue)
                    queue.get_nowait()
                    queue.put_nowait(None)
                else:
                    queue.put_nowait(payload)
            event = json.loads(payload)
            kind = event.get("type")
            if kind == "input_audio_buffer.speech_started":
                await self._barge_in()
            elif kind == "response.function_call_arguments.done" and event.get("name") in self.call_tools:
                self.spawn(self._guard(self._call_tool(event["name"], event.get("arguments") or "{}")))

    async def _barge_in(self) -> None:
        td = self.session.config.turn_detection
        if td is None or not td.interrupt_response:
            return
        cut = await self.playout.interrupt()
        if cut is None:
            return
        item = self.session.conversation.get(cut.item_id)
        if item is None or item.audio_ms <= 0:
            return
        await self.session.handle(ev.ConversationItemTruncate(item_id=cut.item_id, content_index=0,
                                                              audio_end_ms=min(cut.heard_ms, item.audio_ms)))

    async def _call_tool(self, name: str, arguments: str) -> None:
        if name == "end_call":
            await self.hang_up("the model called end_call")
            return
        try:
            target = json.loads(arguments).get("target")
        except (ValueError, AttributeError):
            target = None
        if not isinstance(target, str) or not target:
            log.warning("call %s: transfer_call without a target: %s", self.call_id, arguments[:200])
            return
        await self.transfer(target)

    # -- call control (the model's tools and the app's routes)
    async def hang_up(self, reason: str) -> None:
        await self.playout.drained(_DRAIN_BEFORE_HANGUP_S)
        log.info("call %s: hanging up (%s)", self.call_id, reason)
        try:
            await self.control.hang_up(self.call_id)
        finally:
            self._finish(CallEnded(CLOSE_NORMAL, reason))

    async def transfer(self, target: str) -> None:
        await self.playout.drained(_DRAIN_BEFORE_HANGUP_S)
        await self.control.transfer(self.call_id, target)
        self._finish(CallEnded(CLOSE_NORMAL, f"transferred to {target}"))

    # -- sidebands
    async def attach(self, ws: WebSocket) -> None:
        """A sideband on this call until either ends: it reads every session event and sends client events."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(self.cfg.max_sideband_messages)
        self.sidebands.add(queue)
        log.info("call %s: sideband attached", self.call_id)
        writer = asyncio.create_task(_forward(queue, ws))
        try:
            while not self.ended.is_set():
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await deliver(self.session, message.get("text") or message.get("bytes") or b"")
        finally:
            self.sidebands.discard(queue)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            log.info("call %s: sideband detached", self.call_id)

    async def _close(self) -> None:
        end = self._end or CallEnded(CLOSE_NORMAL, "ended")
        self.book.gone(self.call_id)
        self.slot.release()
        await self.session.close()
        for task in list(self.tasks):
            task.cancel()
        # a send stalled in the transport may not end when cancelled: the call does not wait on it for long
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=_SEND_TIMEOUT_S)
        for queue in self.sidebands:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code=end.code, reason=end.reason[:120]), _SEND_TIMEOUT_S)
        log.info("call %s: ended (%d, %s); %d frames played out", self.call_id, end.code, end.reason,
                 self.playout.frames_sent)


async def _forward(queue: asyncio.Queue[str | None], ws: WebSocket) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while (payload := await queue.get()) is not None:
            await ws.send_text(payload)
        await ws.close(code=CLOSE_NORMAL, reason="the call ended")
