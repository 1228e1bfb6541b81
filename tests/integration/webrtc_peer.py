"""An aiortc peer that makes one call to a fresh server, speaks a WAV (and, with --video, shows a camera's test
pattern), and reports what came back as JSON.

Run inside its own network namespace (see test_webrtc.py) so every packet stays on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import aioice.ice
import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError

from tests.conftest import start_server, stop_server


def _loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"]


class TestPattern(VideoStreamTrack):
    """A camera that shows colour bars, 320x240."""

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        bars = np.repeat(np.array([[255, 255, 255], [255, 255, 0], [0, 255, 255], [0, 255, 0], [255, 0, 255],
                                   [255, 0, 0], [0, 0, 255], [0, 0, 0]], np.uint8), 40, axis=0)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(np.broadcast_to(bars[None], (240, 320, 3))),
                                           format="rgb24")
        frame.pts, frame.time_base = pts, time_base
        return frame


async def call(base_url: str, wav: Path, timeout_s: float, video: bool = False, clear_after_ms: int = 0) -> dict:
    """clear_after_ms > 0: that long after the reply starts playing, cut it off as a page's barge-in does
    (response.cancel, output_audio_buffer.clear), and end with the server's conversation.item.truncated."""
    # This test peer's candidates must be on loopback too; the server is told by its own setting.
    aioice.ice.get_host_addresses = _loopback_only
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    player = MediaPlayer(str(wav))
    pc.addTrack(player.audio)
    if video:
        pc.addTrack(TestPattern())
    channel = pc.createDataChannel("oai-events")
    events: list[dict] = []
    done = asyncio.Event()
    received: list[np.ndarray] = []

    async def cut_off() -> None:
        await asyncio.sleep(clear_after_ms / 1000)
        channel.send(json.dumps({"type": "response.cancel"}))
        channel.send(json.dumps({"type": "output_audio_buffer.clear"}))

    @channel.on("message")
    def on_message(message: str) -> None:
        events.append(json.loads(message))
        kind = events[-1]["type"]
        if clear_after_ms and kind == "output_audio_buffer.started":
            asyncio.ensure_future(cut_off())
        if kind == ("conversation.item.truncated" if clear_after_ms else "output_audio_buffer.stopped"):
            done.set()

    async def listen(track) -> None:
        try:
            while True:
                frame = await track.recv()
                samples = frame.to_ndarray().reshape(-1).astype(np.float32) / 32768
                received.append(samples)
        except MediaStreamError:
            pass

    @pc.on("track")
    def on_track(track) -> None:
        asyncio.ensure_future(listen(track))

    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{base_url}/v1/realtime/calls?model=tiny", content=pc.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp"})
        answer.raise_for_status()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            pass
        during = (await http.get(f"{base_url}/health")).json()
        await pc.close()
        player.audio.stop()
        deadline = time.monotonic() + 10
        while True:
            after = (await http.get(f"{base_url}/health")).json()
            if (after["active_sessions"] == 0 and after["active_requests"] == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    audio = np.concatenate(received) if received else np.zeros(0, np.float32)
    done_event = next((e for e in events if e["type"] == "response.done"), None)
    user_items = [e["item"] for e in events if e["type"] == "conversation.item.done" and e["item"]["role"] == "user"]
    video_section = answer.text.split("m=video")[1].split("m=")[0] if "m=video" in answer.text else ""
    return {
        "answer_video": next((d for d in ("recvonly", "sendrecv", "sendonly", "inactive") if f"a={d}" in video_section),
                             None),
        "user_content": [[c["type"] for c in item["content"]] for item in user_items],
        "image_tokens": (done_event["response"]["usage"]["input_token_details"].get("image_tokens", 0)
                         if done_event and done_event["response"].get("usage") else 0),
        "answer_status": answer.status_code,
        "answer_has_loopback_candidate": "127.0.0.1" in answer.text,
        "events": [e["type"] for e in events],
        "truncated": next((e for e in events if e["type"] == "conversation.item.truncated"), None),
        "errors": [e["error"] for e in events if e["type"] == "error"],
        "response_status": next((e["response"]["status"] for e in events if e["type"] == "response.done"), None),
        "received_seconds": audio.size / 48_000,
        "received_peak": float(np.abs(audio).max()) if audio.size else 0.0,
        "health_during": during,
        "health_after_close": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--wav", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--video", action="store_true", help="send a camera track too")
    parser.add_argument("--clear-after-ms", type=int, default=0, help="cut the reply off this long into its playing")
    args = parser.parse_args()
    proc, server = start_server(args.cache_dir, args.out.with_suffix(".server.log"), "--webrtc-host-address", "127.0.0.1")
    try:
        result = asyncio.run(call(server.base_url, args.wav, args.timeout, args.video, args.clear_after_ms))
    finally:
        stop_server(proc)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
