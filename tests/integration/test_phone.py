"""Phone calls end to end: `voice-gateway serve assistant` on loopback answers calls from a simulated carrier
(bench/phone_carrier.py, written from Twilio's and Telnyx's references), with the app's server (a
local webhook receiver that accepts each call) and Twilio's REST API (a local HTTP server) beside it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import websockets

from bench.phone_carrier import CarrierCall, answer_stream, ring, ulaw_encode
from engine.cascade.ears import WhisperEars
from tests.conftest import Server, start_server, stop_server
from tests.unit.test_assistant import edits
from voice_gateway.audio.g711 import ulaw_decode
from voice_gateway.audio.resample import resample

pytestmark = pytest.mark.asyncio(loop_scope="module")

AUTH_TOKEN = "twilio-auth-token"
ACCOUNT_SID = "AC" + "1" * 32
CARRIER_SECRET = "carrier-secret"
API_KEY = "phone-test-key"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"the app's signing key").decode()
QUESTION = "What is the capital of France?"
BARGE_IN = "Wait, stop please."
VAD_MIN_SPEECH_S = 0.15  # voice_gateway/audio/vad.py: what the VAD must hear before it calls it speech


class Recorder(ThreadingHTTPServer):
    """A local HTTP server that keeps each request it is sent (method, path, headers, body)."""

    def __init__(self, reply) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                recorder.requests.append(("POST", self.path, dict(self.headers), body))
                status, payload = reply(self.path, dict(self.headers), body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class App:
    """The app's server: verifies each incoming-call webhook's Standard Webhooks signature, then accepts the call
    with `sessions[call_id]` (or `{}`), or rejects it where that is None."""

    def __init__(self) -> None:
        self.gateway_url = ""
        self.sessions: dict[str, dict | None] = {}
        self.bad_signatures = 0
        self.server = Recorder(self._webhook)

    def _webhook(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        key = base64.b64decode(WEBHOOK_SECRET.removeprefix("whsec_"))
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        if not hmac.compare_digest(expected, headers["webhook-signature"]):
            self.bad_signatures += 1
            return 400, b"{}"
        event = json.loads(body)
        assert event["type"] == "realtime.call.incoming", event
        call_id = event["data"]["call_id"]
        session = self.sessions.get(call_id, {})
        verb = "reject" if session is None else "accept"
        reply = httpx.post(f"{self.gateway_url}/v1/realtime/calls/{call_id}/{verb}", json=session,
                           headers={"authorization": f"Bearer {API_KEY}"}, timeout=10)
        assert reply.status_code == 200, reply.text
        return 200, b"{}"


def _twilio_rest(path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    sid = path.rsplit("/", 1)[-1].removesuffix(".json")
    return 200, json.dumps({"sid": sid, "account_sid": ACCOUNT_SID, "status": "completed"}).encode()


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    app = App()
    yield app
    app.server.shutdown()
    app.server.server_close()


@pytest.fixture(scope="module")
def twilio_api() -> Iterator[Recorder]:
    rest = Recorder(_twilio_rest)
    yield rest
    rest.shutdown()
    rest.server_close()


def start_phone_server(cache_dir: Path, log_path: Path, app: App, twilio_api: Recorder, *extra: str,
                       model: str = "tiny") -> tuple[subprocess.Popen, Server]:
    """`voice-gateway serve` with the Twilio account, the carriers' secret and the app's webhook set, keyed; the
    app then calls it back."""
    env = {"VOICE_GATEWAY_TWILIO_AUTH_TOKEN": AUTH_TOKEN, "VOICE_GATEWAY_TWILIO_ACCOUNT_SID": ACCOUNT_SID,
           "VOICE_GATEWAY_TWILIO_API_BASE": twilio_api.url, "VOICE_GATEWAY_PHONE_SECRET": CARRIER_SECRET,
           "VOICE_GATEWAY_PHONE_WEBHOOK_URL": app.server.url + "/webhook",
           "VOICE_GATEWAY_PHONE_WEBHOOK_SECRET": WEBHOOK_SECRET}
    with pytest.MonkeyPatch.context() as patch:  # start_server passes this process's environment on
        for name, value in env.items():
            patch.setenv(name, value)
        proc, server = start_server(cache_dir, log_path, "--api-key", API_KEY, *extra, model=model)
    app.gateway_url = server.base_url
    return proc, server


@pytest.fixture(scope="module")
def phone_server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory, app: App,
                 twilio_api: Recorder) -> Iterator[Server]:
    proc, server = start_phone_server(cache_dir, tmp_path_factory.mktemp("phone") / "server.log", app, twilio_api,
                                      model="assistant")
    yield server
    stop_server(proc)


def _spoken(text: str, tmp: Path) -> np.ndarray:
    """`text` spoken by espeak-ng, float32 at 8 kHz, its leading silence cut (the speech starts at sample 0)."""
    wav = tmp / f"{abs(hash(text))}.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), text], check=True)
    samples, rate = sf.read(wav, dtype="float32")
    samples = resample(samples, rate, 8000)
    return samples[int(np.argmax(np.abs(samples) > 0.02)):]


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return _spoken(QUESTION, tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return _spoken("What color is the sky?", tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="module")
def barge_in(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return _spoken(BARGE_IN, tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="module")
def ears() -> WhisperEars:
    return WhisperEars.from_package(cpu_threads=1, workers=1)


class Sideband:
    """The app's sideband on a live call: every event it is sent, kept."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict] = []
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for text in self.ws:
                self.events.append(json.loads(text))
                self._arrived.set()

    async def until(self, kind: str, timeout_s: float = 120, after: int = 0, **fields: object) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events[after:]:
                if event["type"] == kind and all(event.get(k) == v for k, v in fields.items()):
                    return event
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} in {timeout_s} s: {[e['type'] for e in self.events]}")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), 1)

    async def send(self, event: dict) -> None:
        await self.ws.send(json.dumps(event))


async def sideband(server: Server, call_id: str) -> Sideband:
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime?call_id=" + urllib.parse.quote(call_id)
    deadline = time.monotonic() + 10
    while True:  # the call goes live once its stream's start is read
        try:
            ws = await websockets.connect(url, additional_headers={"authorization": f"Bearer {API_KEY}"})
            return Sideband(ws)
        except websockets.InvalidStatus:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _answered(server: Server, carrier: str = "twilio") -> tuple[str, dict[str, str], str]:
    reply, call_id = await ring(server.base_url, carrier, auth_token=AUTH_TOKEN if carrier == "twilio" else None,
                                secret=CARRIER_SECRET if carrier != "twilio" else None)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/xml"), reply.text
    url, params = answer_stream(reply.text)
    assert url.startswith("ws://127.0.0.1") and url.endswith(f"/v1/phone/{carrier}/media"), url
    return url, params, call_id


async def _accepted_with(server: Server, app: App, session: dict) -> tuple[str, dict[str, str], str]:
    """A Twilio call the app accepts with `session`: its stream's URL, its `start` parameters and its id."""
    call_id = "CA" + os.urandom(16).hex()
    app.sessions[call_id] = session
    reply, _ = await ring(server.base_url, "twilio", auth_token=AUTH_TOKEN, call_id=call_id)
    url, params = answer_stream(reply.text)
    return url, params, call_id


async def _no_sessions_left(server: Server) -> None:
    deadline = time.monotonic() + 10
    while (active := server.get("/health").json()["active_sessions"]) != 0:
        assert time.monotonic() < deadline, f"{active} sessions still held"
        await asyncio.sleep(0.1)


async def _played_out(call: CarrierCall, quiet_s: float = 1.0, timeout_s: float = 60) -> None:
    """Until the caller has heard everything sent and nothing more came for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    last, since = call.frames_in, time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if call.frames_in != last or call.playing:
            last, since = call.frames_in, time.monotonic()
        elif time.monotonic() - since > quiet_s:
            return
    raise AssertionError("the reply never finished playing")


async def test_spoken_questions_are_answered_in_ulaw_that_says_its_transcript(
        phone_server: Server, app: App, question: np.ndarray, sky: np.ndarray, ears: WhisperEars) -> None:
    """The caller asks two questions over a Twilio stream; each reply comes back as 20 ms µ-law frames paced at the
    line's rate (never more than the lead and a little jitter queued), and Whisper hears the replies say their
    transcripts: at most 25 % word error over both. Over both, and at temperature 0, for the reasons
    tests/integration/test_assistant_clients.py gives ("... France is Paris" is always heard "Francis Paris")."""
    # replies within Whisper's 30 s
    url, params, call_id = await _accepted_with(phone_server, app, {"temperature": 0.0, "max_output_tokens": 40})
    said, audio, latencies = [], [], []
    async with CarrierCall("twilio", url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await asyncio.sleep(0.5)
        for speech in (question, sky):
            after, start_byte = len(band.events), call.next_turn()
            call.speak(np.concatenate([speech, np.zeros(4000, np.float32)]))
            done = await band.until("response.done", after=after)
            await _played_out(call)
            assert done["response"]["status"] == "completed", done
            said.append(done["response"]["output"][0]["content"][0]["transcript"])
            audio.append(bytes(call.heard.ulaw[start_byte:]))
            assert call.speech_ended_at is not None and call.heard.first_media_at is not None
            latencies.append(call.heard.first_media_at - call.speech_ended_at)
    print(f"end of speech -> first audio at the phone: {', '.join(f'{s:.3f} s' for s in latencies)}")
    assert call.heard.max_queued_bytes <= 0.3 * 8000, call.heard.max_queued_bytes  # the lead (0.1 s) + jitter
    assert len(call.heard.echoed) == call.frames_in and not call.heard.dropped  # a mark after every frame
    heard_back = ears.transcribe_many([resample(ulaw_decode(a), 8000, 16_000) for a in audio])
    (e1, n1), (e2, n2) = edits(said[0], heard_back[0]), edits(said[1], heard_back[1])
    assert (e1 + e2) / (n1 + n2) <= 0.25, (said, heard_back)
    await _no_sessions_left(phone_server)


async def test_barge_in_brings_clear_and_truncates_at_the_last_echoed_mark(
        phone_server: Server, question: np.ndarray, barge_in: np.ndarray) -> None:
    url, params, call_id = await _answered(phone_server)
    async with CarrierCall("twilio", url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await asyncio.sleep(0.5)
        call.speak(np.concatenate([question, np.zeros(4000, np.float32)]))
        while call.heard.first_media_at is None:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.6)  # the caller hears the start of the reply
        assert call.playing, "the reply was too short to interrupt"
        call.speak(barge_in)
        spoke_at = time.monotonic()
        while not call.heard.clears and time.monotonic() - spoke_at < 5:
            await asyncio.sleep(0.005)
        assert call.heard.clears, "no clear after the caller spoke over the reply"
        clear_after_s = call.heard.clears[0] - spoke_at
        truncated = await band.until("conversation.item.truncated", timeout_s=10)
    # the VAD needs VAD_MIN_SPEECH_S of speech to call it speech: the clear follows within 300 ms of that
    print(f"caller's speech -> clear: {clear_after_s:.3f} s")
    assert clear_after_s <= VAD_MIN_SPEECH_S + 0.3, clear_after_s
    played_ms = call.heard.echoed_at_bytes[-1] // 8 if call.heard.echoed_at_bytes else 0
    assert abs(truncated["audio_end_ms"] - played_ms) <= 40, (truncated, played_ms)
    await _no_sessions_left(phone_server)


async def test_a_pressed_key_reaches_the_sideband(phone_server: Server) -> None:
    url, params, call_id = await _answered(phone_server)
    async with CarrierCall("twilio", url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await call.dtmf("5")
        event = await band.until("input_audio_buffer.dtmf_event_received", timeout_s=10)
    assert event["event"] == "5" and abs(event["received_at"] - time.time()) < 60, event
    await _no_sessions_left(phone_server)


async def test_a_pressed_key_is_a_user_item_where_the_apps_accept_asks(phone_server: Server, app: App) -> None:
    url, params, call_id = await _accepted_with(phone_server, app, {"dtmf_items": True})  # the server's is off
    async with CarrierCall("twilio", url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await call.dtmf("5")
        await band.until("input_audio_buffer.dtmf_event_received", timeout_s=10)
        added = await band.until("conversation.item.added", timeout_s=10)
    assert added["item"]["role"] == "user", added
    assert added["item"]["content"][0]["text"] == "The caller pressed the 5 key.", added
    await _no_sessions_left(phone_server)


async def test_end_call_hangs_up_through_twilios_rest_api(phone_server: Server, app: App, twilio_api: Recorder,
                                                         question: np.ndarray) -> None:
    """The app enables the built-in `end_call` (and, so the small model surely calls it, requires it): the caller's
    question ends the call, through Twilio's REST API, and the stream closes."""
    url, params, call_id = await _accepted_with(phone_server, app, {
        "tools": [{"type": "function", "name": "end_call"}], "tool_choice": {"type": "function", "name": "end_call"}})
    async with CarrierCall("twilio", url, params, call_id) as call:
        await asyncio.sleep(0.3)
        call.speak(np.concatenate([question, np.zeros(4000, np.float32)]))
        await asyncio.wait_for(call.closed.wait(), 120)
    assert call.close_code == 1000, call.close_code
    [hangup] = [r for r in twilio_api.requests if call_id in r[1]]
    assert hangup[1] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/{call_id}.json", hangup
    assert urllib.parse.parse_qs(hangup[3].decode()) == {"Status": ["completed"]}, hangup
    await _no_sessions_left(phone_server)


async def test_transfer_call_dials_the_target_through_twilios_rest_api(
        phone_server: Server, app: App, twilio_api: Recorder, question: np.ndarray) -> None:
    """The app enables and requires the built-in `transfer_call`: the call gets new TwiML that dials the target the
    model named, through Twilio's REST API, and the stream closes."""
    url, params, call_id = await _accepted_with(phone_server, app, {
        "tools": [{"type": "function", "name": "transfer_call"}],
        "tool_choice": {"type": "function", "name": "transfer_call"}})
    async with CarrierCall("twilio", url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await asyncio.sleep(0.3)
        call.speak(np.concatenate([question, np.zeros(4000, np.float32)]))
        called = await band.until("response.function_call_arguments.done", name="transfer_call")
        await asyncio.wait_for(call.closed.wait(), 60)
    target = json.loads(called["arguments"])["target"]
    [transfer] = [r for r in twilio_api.requests if call_id in r[1]]
    assert transfer[1] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/{call_id}.json", transfer
    twiml = urllib.parse.parse_qs(transfer[3].decode())["Twiml"][0]
    assert twiml.startswith("<Response><Dial>") and twiml.endswith("</Dial></Response>"), twiml
    assert target.strip() and call.close_code == 1000, (target, call.close_code)
    await _no_sessions_left(phone_server)


async def test_the_sideband_answers_a_function_call_the_caller_triggered(phone_server: Server, app: App,
                                                                        question: np.ndarray) -> None:
    url, params, call_id = await _accepted_with(phone_server, app, {
        "tools": [{"type": "function", "name": "lookup_capital", "description": "The capital of a country.",
                   "parameters": {"type": "object", "properties": {"country": {"type": "string"}},
                                  "required": ["country"]}}],
        "tool_choice": {"type": "function", "name": "lookup_capital"}})
    async with CarrierCall("twilio", url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await asyncio.sleep(0.3)
        call.speak(np.concatenate([question, np.zeros(4000, np.float32)]))
        called = await band.until("response.function_call_arguments.done", name="lookup_capital")
        await band.until("response.done")  # the response that made the call
        assert call.frames_in == 0  # the forced call says nothing
        after = len(band.events)
        await band.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": called["call_id"], "output": '{"capital": "Paris"}'}})
        await band.send({"type": "response.create", "response": {"tool_choice": "none"}})
        done = await band.until("response.done", after=after)
        await _played_out(call)
    assert done["response"]["status"] == "completed", done
    assert call.frames_in > 0, done  # the answer reached the phone
    await _no_sessions_left(phone_server)


@pytest.mark.parametrize("carrier", ["telnyx", "plivo"])
async def test_a_telnyx_or_plivo_stream_is_answered(phone_server: Server, question: np.ndarray, carrier: str) -> None:
    url, params, call_id = await _answered(phone_server, carrier)
    async with CarrierCall(carrier, url, params, call_id) as call:
        band = await sideband(phone_server, call_id)
        await asyncio.sleep(0.3)
        call.speak(np.concatenate([question, np.zeros(4000, np.float32)]))
        done = await band.until("response.done")
        await _played_out(call)
    assert done["response"]["status"] == "completed", done
    assert call.frames_in > 0 and len(call.heard.echoed) == call.frames_in
    await _no_sessions_left(phone_server)


# -- bad input


async def test_an_unsigned_or_wrongly_signed_webhook_is_403(phone_server: Server) -> None:
    unsigned, _ = await ring(phone_server.base_url, "twilio")
    wrong, _ = await ring(phone_server.base_url, "twilio", auth_token="not-the-token")
    no_secret, _ = await ring(phone_server.base_url, "telnyx")
    assert unsigned.status_code == wrong.status_code == no_secret.status_code == 403


async def _refused(url: str, start_params: dict[str, str], call_id: str, carrier: str = "twilio") -> int | None:
    async with CarrierCall(carrier, url, start_params, call_id) as call:
        await asyncio.wait_for(call.closed.wait(), 15)
    return call.close_code


async def test_a_stream_without_a_valid_token_or_for_another_call_is_closed_1008(phone_server: Server) -> None:
    url, params, call_id = await _answered(phone_server)
    assert await _refused(url, {"token": "forged"}, call_id) == 1008
    assert await _refused(url, params, "CA" + "9" * 32) == 1008  # a call this server did not answer
    async with CarrierCall("twilio", url, params, call_id):  # the token still opens its own call, once
        await sideband(phone_server, call_id)
    assert await _refused(url, params, call_id) == 1008  # and not twice
    await _no_sessions_left(phone_server)


async def test_malformed_oversized_and_startless_streams_are_closed(phone_server: Server) -> None:
    for frame, code in ((b"not json {", 1007), ("x" * 100_000, 1009)):
        url, params, call_id = await _answered(phone_server)
        async with CarrierCall("twilio", url, params, call_id) as call:
            await asyncio.sleep(0.3)
            await call.ws.send(frame)
            await asyncio.wait_for(call.closed.wait(), 10)
        assert call.close_code == code, (frame[:10], call.close_code)
    url, _, _ = await _answered(phone_server)
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 20)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    await _no_sessions_left(phone_server)


async def test_a_sideband_needs_the_key_and_a_live_call(phone_server: Server) -> None:
    url = phone_server.base_url.replace("http://", "ws://") + "/v1/realtime?call_id=CAnone"
    for headers in ({"authorization": f"Bearer {API_KEY}"}, {}):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers=headers)
        assert refused.value.response.status_code == 403


async def test_the_app_can_reject_a_call(phone_server: Server, app: App) -> None:
    call_id = "CA" + os.urandom(16).hex()
    app.sessions[call_id] = None
    reply, _ = await ring(phone_server.base_url, "twilio", auth_token=AUTH_TOKEN, call_id=call_id)
    assert reply.status_code == 200 and "<Reject" in reply.text and "<Stream" not in reply.text, reply.text
    assert app.bad_signatures == 0


async def test_a_carrier_that_stops_reading_is_closed_and_its_session_freed(phone_server: Server,
                                                                           question: np.ndarray) -> None:
    """A carrier that reads nothing while a reply plays (a receive window of a few KiB, never read, so no mark ever
    comes back): the server gives the call up 5 s after its first unechoed mark, and the session's slot comes
    back."""
    url, params, call_id = await _answered(phone_server)
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # set before connecting: no window to grow into
    sock.connect((host, port))
    sock.setblocking(False)
    ws = await websockets.connect(url, sock=sock, max_queue=1)
    stream = {"streamSid": "MZ" + os.urandom(16).hex()}
    await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
    await ws.send(json.dumps({"event": "start", **stream, "start": {
        "callSid": call_id, "customParameters": params,
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
    line = ulaw_encode(np.concatenate([np.zeros(4000, np.float32), question, np.zeros(60 * 8000, np.float32)]))
    started, freed_at = time.monotonic(), None
    with contextlib.suppress(websockets.ConnectionClosed, OSError):
        for n, i in enumerate(range(0, len(line), 160)):  # the caller speaks on and never reads
            await asyncio.sleep(max(0.0, started + n * 0.02 - time.monotonic()))
            await ws.send(json.dumps({"event": "media", **stream, "media": {
                "track": "inbound", "chunk": str(n), "timestamp": str(n * 20),
                "payload": base64.b64encode(line[i:i + 160]).decode()}}))
            if n % 50 == 0 and phone_server.get("/health").json()["active_sessions"] == 0 and n > 100:
                freed_at = time.monotonic()
                break
    ws.transport.abort()
    assert freed_at is not None, "the session was still held after a minute of a carrier that does not read"
    assert "the carrier took no frame" in phone_server.log()


async def test_the_app_hangs_up_and_transfers_live_calls(phone_server: Server, twilio_api: Recorder) -> None:
    """`/v1/realtime/calls/{id}/hangup` and `/refer`, with the API key: Twilio's REST API is told (Status=completed;
    new TwiML that dials the target), and the stream closes. Without the key, or for a call not live: refused."""
    headers = {"authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=phone_server.base_url, timeout=30) as http:
        assert (await http.post("/v1/realtime/calls/CAnone/hangup")).status_code == 401
        assert (await http.post("/v1/realtime/calls/CAnone/hangup", headers=headers)).status_code == 404
        for verb, body in (("hangup", None), ("refer", {"target_uri": "tel:+14155550123"})):
            url, params, call_id = await _answered(phone_server)
            async with CarrierCall("twilio", url, params, call_id) as call:
                await sideband(phone_server, call_id)  # the call is live
                reply = await http.post(f"/v1/realtime/calls/{call_id}/{verb}", json=body, headers=headers)
                assert reply.status_code == 200, reply.text
                await asyncio.wait_for(call.closed.wait(), 10)
            assert call.close_code == 1000, (verb, call.close_code)
            [request] = [r for r in twilio_api.requests if call_id in r[1]]
            form = urllib.parse.parse_qs(request[3].decode())
            if verb == "hangup":
                assert form == {"Status": ["completed"]}, form
            else:
                assert form == {"Twiml": ["<Response><Dial>+14155550123</Dial></Response>"]}, form
    await _no_sessions_left(phone_server)
