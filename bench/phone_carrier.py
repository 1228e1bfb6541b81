"""A simulated phone carrier, for the tests and `voice-gateway bench --phone`, written from the carriers' published
media-stream references (Twilio's "Media Streams - WebSocket Messages" and its webhook security page; Telnyx's
"Stream call media over WebSocket"), not from the server's code (the bench imports none of it).

It plays Twilio (or Telnyx) answering a call: it signs and POSTs the voice webhook, reads the answer document's
`<Connect><Stream>`, opens the stream and says `connected` and `start` with the document's parameters, then sends
the caller's line as 20 ms µ-law `media` frames in real time (silence unless `speak` queued speech). Like a phone it
plays what the server sends at 8 kHz in real time, echoes each `mark` once the audio before it has played (at once
when nothing is queued), and on `clear` drops what it holds and echoes the marks it dropped."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
import uuid
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field

import httpx
import numpy as np
import websockets

FRAME_BYTES = 160  # 20 ms at 8 kHz, one byte a sample
FRAME_S = 0.02
SILENCE = b"\xff" * FRAME_BYTES  # µ-law's zero


def ulaw_encode(samples: np.ndarray) -> bytes:
    """Float32 in [-1, 1] -> G.711 µ-law bytes (ITU-T G.711's segment encoding, bias 132 on 14-bit magnitudes)."""
    pcm = (np.clip(samples, -1.0, 32767 / 32768) * 32768).astype(np.int32)
    sign = np.where(pcm < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(pcm), 32635) + 132
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 7  # 0..7: the segment
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()


def twilio_signature(auth_token: str, url: str, params: dict[str, str]) -> str:
    """Twilio's webhook signature: base64 HMAC-SHA1 of the URL followed by each POST parameter's name and value,
    sorted by name, keyed with the account's auth token."""
    data = url + "".join(k + params[k] for k in sorted(params))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode()


@dataclass(frozen=True)
class Wire:
    """The carrier's names (the one place the references differ for what this carrier does)."""

    stream_key: str
    sequence_key: str
    start: dict  # the `start` object, less the parameters
    media_in: str = "media"  # what the server's audio is called
    mark_in: str = "mark"  # what its marks are called; each comes back as `mark_echo(name)`
    clear_in: str = "clear"

    @staticmethod
    def of(carrier: str, call_id: str) -> Wire:
        if carrier == "twilio":
            return Wire("streamSid", "sequenceNumber", {
                "accountSid": "AC" + "0" * 32, "callSid": call_id, "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}})
        if carrier == "plivo":
            return Wire("streamId", "sequenceNumber", {
                "callId": call_id, "accountId": "MA" + "0" * 18, "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}},
                "playAudio", "checkpoint", "clearAudio")
        return Wire("stream_id", "sequence_number", {
            "user_id": str(uuid.uuid4()), "call_control_id": call_id, "from": "+13122010094", "to": "+13122123456",
            "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}})

    def start_message(self, parameters: dict[str, str]) -> dict:
        if self.mark_in == "checkpoint":  # Plivo: the stream's extra headers, "k=v,...", beside `start`
            return {"event": "start", "start": self.start,
                    "extra_headers": ",".join(f"{k}={v}" for k, v in parameters.items())}
        key = "customParameters" if self.stream_key == "streamSid" else "custom_parameters"
        return {"event": "start", "start": {**self.start, key: parameters}}

    def mark_name(self, message: dict) -> str:
        return message["name"] if self.mark_in == "checkpoint" else message["mark"]["name"]

    def mark_echo(self, name: str) -> dict:
        if self.mark_in == "checkpoint":
            return {"event": "playedStream", "name": name}
        return {"event": "mark", "mark": {"name": name}}


@dataclass
class Heard:
    """What reached the caller: the played µ-law, each frame's play time, and the control messages' arrival times."""

    ulaw: bytearray = field(default_factory=bytearray)
    first_media_at: float | None = None
    media_times: list[float] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)
    echoed: list[str] = field(default_factory=list)  # marks echoed after their audio played
    echoed_at_bytes: list[int] = field(default_factory=list)  # how much audio had played at each of those echoes
    max_queued_bytes: int = 0  # the most audio ever waiting to play: what a burst would swell
    gap_ms: int = 0  # silence inside replies: the phone ran dry and then more of the reply came (it fell behind)
    dry_ms: int = 0  # the current dry spell, counted into gap_ms if audio follows it
    dropped: list[str] = field(default_factory=list)  # marks echoed because a clear dropped their audio


def answer_stream(document: str) -> tuple[str, dict[str, str]]:
    """The stream URL and parameters of an answer's `<Connect><Stream>` (Twilio, Telnyx), or of its bidirectional
    `<Stream>`, the URL its text and the parameters its `extraHeaders` (Plivo)."""
    root = ET.fromstring(document)
    stream = root.find("./Connect/Stream")
    if stream is not None:
        return stream.attrib["url"], {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
    stream = root.find("./Stream")
    assert stream is not None and stream.attrib.get("bidirectional") == "true", document
    headers = stream.attrib.get("extraHeaders", "")
    return (stream.text or "").strip(), dict(pair.split("=", 1) for pair in headers.split(",") if "=" in pair)


class CarrierCall:
    """One call's stream, seen from the carrier: `async with CarrierCall(...)` opens it, leaving closes it."""

    def __init__(self, carrier: str, stream_url: str, parameters: dict[str, str], call_id: str) -> None:
        self.carrier = carrier
        self.url = stream_url
        self.parameters = parameters
        self.call_id = call_id
        self.wire = Wire.of(carrier, call_id)
        self.stream_id = ("MZ" if carrier == "twilio" else "") + uuid.uuid4().hex
        self.heard = Heard()
        self._speech = bytearray()
        self.speech_ended_at: float | None = None
        self._playback: deque[tuple[str, bytes | str]] = deque()  # ("audio", µ-law) or ("mark", name)
        self._sequence = 0
        self._chunk = 0
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.frames_in = 0
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> CarrierCall:
        self.ws = await websockets.connect(self.url, max_size=2**20)
        await self._send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self._send(self.wire.start_message(self.parameters))
        self._tasks = [asyncio.create_task(f()) for f in (self._line, self._receive, self._play)]
        return self

    @property
    def playing(self) -> bool:
        return any(kind == "audio" for kind, _ in self._playback)

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self._send({"event": "stop", "stop": {"callSid": self.call_id}})
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ws.close()

    async def _send(self, message: dict) -> None:
        self._sequence += 1
        await self.ws.send(json.dumps({**message, self.wire.sequence_key: str(self._sequence),
                                       self.wire.stream_key: self.stream_id}))

    def speak(self, samples_8k: np.ndarray) -> None:
        """Queue speech (float32 at 8 kHz) on the caller's line; it goes out in real time."""
        self._speech += ulaw_encode(samples_8k)
        self.speech_ended_at = None

    def next_turn(self) -> int:
        """Forget the last reply's first frame, queue peak and gaps (what a turn measures); returns the bytes played
        so far, where this turn's reply will start."""
        heard = self.heard
        heard.first_media_at, heard.max_queued_bytes, heard.gap_ms, heard.dry_ms = None, 0, 0, 0
        return len(heard.ulaw)

    async def dtmf(self, digit: str) -> None:
        track = "inbound_track"
        await self._send({"event": "dtmf", "dtmf": {"track": track, "digit": digit}})

    async def _line(self) -> None:
        """The caller's microphone: a frame every 20 ms, on the wall clock."""
        started = time.monotonic()
        n = 0
        while True:
            await asyncio.sleep(max(0.0, started + n * FRAME_S - time.monotonic()))
            chunk, self._speech[:FRAME_BYTES] = bytes(self._speech[:FRAME_BYTES]), b""
            if chunk and not self._speech:
                self.speech_ended_at = time.monotonic()
            chunk = chunk.ljust(FRAME_BYTES, b"\xff")
            self._chunk += 1
            await self._send({"event": "media", "media": {"track": "inbound", "chunk": str(self._chunk),
                                                          "timestamp": str(n * 20),
                                                          "payload": base64.b64encode(chunk).decode()}})
            n += 1

    async def _receive(self) -> None:
        try:
            async for text in self.ws:
                message = json.loads(text)
                assert message.get(self.wire.stream_key) == self.stream_id, message
                event = message["event"]
                if event == self.wire.media_in:
                    audio = base64.b64decode(message["media"]["payload"])
                    self.frames_in += 1
                    if self.heard.first_media_at is None:
                        self.heard.first_media_at = time.monotonic()
                    self._playback.append(("audio", audio))
                    queued = sum(len(v) for k, v in self._playback if k == "audio")
                    self.heard.max_queued_bytes = max(self.heard.max_queued_bytes, queued)
                elif event == self.wire.mark_in:
                    self._playback.append(("mark", self.wire.mark_name(message)))
                elif event == self.wire.clear_in:
                    self.heard.clears.append(time.monotonic())
                    for kind, value in list(self._playback):
                        if kind == "mark":
                            self.heard.dropped.append(str(value))
                            await self._send(self.wire.mark_echo(str(value)))
                    self._playback.clear()
                else:
                    raise AssertionError(f"a message the carrier does not know: {message}")
        except websockets.ConnectionClosed as closed:
            self.close_code = closed.rcvd.code if closed.rcvd else None
        else:
            self.close_code = self.ws.close_code
        finally:
            self.closed.set()

    async def _play(self) -> None:
        """The caller's ear: 160 bytes every 20 ms from what was received; a mark echoes once reached."""
        started, n = time.monotonic(), 0
        while True:
            await asyncio.sleep(max(0.0, started + n * FRAME_S - time.monotonic()))
            n += 1
            budget = FRAME_BYTES
            if not self.playing and self.heard.first_media_at is not None:
                self.heard.dry_ms += 20
            while self._playback and (self._playback[0][0] == "mark" or budget > 0):
                kind, value = self._playback[0]
                if kind == "mark":
                    self._playback.popleft()
                    self.heard.echoed.append(str(value))
                    self.heard.echoed_at_bytes.append(len(self.heard.ulaw))
                    await self._send(self.wire.mark_echo(str(value)))
                    continue
                assert isinstance(value, bytes), value
                take = value[:budget]
                if budget == FRAME_BYTES:
                    self.heard.gap_ms += self.heard.dry_ms if self.heard.dry_ms <= 2000 else 0  # longer: a new reply
                    self.heard.dry_ms = 0
                self.heard.ulaw += take
                self.heard.media_times.append(time.monotonic())
                budget -= len(take)
                if len(take) == len(value):
                    self._playback.popleft()
                else:
                    self._playback[0] = ("audio", value[len(take):])


async def ring(base_url: str, carrier: str, *, auth_token: str | None = None, secret: str | None = None,
               call_id: str | None = None) -> tuple[httpx.Response, str]:
    """The carrier's voice webhook for a new call: its reply and the call's id."""
    call_id = call_id or ("CA" + uuid.uuid4().hex if carrier == "twilio" else "v3:" + uuid.uuid4().hex)
    form = {"AccountSid": "AC" + "0" * 32, "CallSid": call_id, "From": "+14155550100", "To": "+14155550199",
            "CallStatus": "ringing", "Direction": "inbound"}
    if carrier == "plivo":  # Plivo's answer URL names the call CallUUID
        form = {"CallUUID": call_id, "From": "14155550100", "To": "14155550199", "CallStatus": "ringing",
                "Direction": "inbound"}
    url = f"{base_url}/v1/phone/{carrier}/incoming" + (f"?secret={secret}" if secret else "")
    headers = {"X-Twilio-Signature": twilio_signature(auth_token, url, form)} if auth_token else {}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(url, data=form, headers=headers), call_id
