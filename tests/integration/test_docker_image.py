"""The CPU image (docker/Dockerfile.cpu), as scripts/docker_ci.sh built it: started as a container serving the
tiny model, driven over /health, a chat request with audio, a realtime turn over WebSocket and a spoken turn that
`semantic_vad` ends on the Smart Turn model the image installs (its log names the model file and its first
decision); and started on its default, the assistant, which answers a spoken question. Each is then stopped and
removed. Skips, with the script's reason, where docker cannot run; fails where it runs and the
image does not build."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import tempfile
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
import soxr
import websockets

DOCKER = "/usr/bin/docker"  # Debian's docker.io, as the script used
STATE = Path(os.environ.get("VG_DOCKER_STATE", "/tmp/vg-docker/state"))
RATE = 24_000


def _docker(*args: str, timeout_s: float = 60) -> str:
    return subprocess.run([DOCKER, *args], check=True, capture_output=True, text=True, timeout=timeout_s).stdout.strip()


def _built_image() -> str:
    if not STATE.exists():
        pytest.skip(f"scripts/docker_ci.sh has not run here (scripts/test.sh runs it): no {STATE}")
    key, _, value = STATE.read_text().strip().partition("=")
    if key == "skip":
        pytest.skip(f"docker cannot run here: {value}")
    if key != "image":
        pytest.fail(f"the CPU image did not build: {value or 'scripts/docker_ci.sh wrote nothing'}")
    return value


@dataclass(frozen=True)
class Container:
    id: str
    url: str

    def logs(self) -> str:
        run = subprocess.run([DOCKER, "logs", self.id], capture_output=True, text=True, timeout=30, check=True)
        return run.stdout + run.stderr


@pytest.fixture(scope="module")
def container() -> Iterator[Container]:
    yield from _serving("tiny")


@pytest.fixture(scope="module")
def assistant_container() -> Iterator[Container]:
    yield from _serving()  # the image's default


def _serving(*model: str) -> Iterator[Container]:
    image = _built_image()
    container = _docker("run", "--detach", "--publish", "127.0.0.1::8000", image, *model)
    try:
        port = _docker("port", container, "8000/tcp").splitlines()[0].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            running = _docker("inspect", "--format", "{{.State.Running}}", container)
            if running != "true" or time.monotonic() > deadline:
                pytest.fail(f"the container did not serve (running: {running}):\n{_docker('logs', container)[-3000:]}")
            time.sleep(0.5)
        yield Container(container, url)
    finally:
        subprocess.run([DOCKER, "stop", "--time", "15", container], capture_output=True, timeout=60)
        logs = subprocess.run([DOCKER, "logs", container], capture_output=True, text=True, timeout=30)
        subprocess.run([DOCKER, "rm", "--force", container], capture_output=True, timeout=60)
    assert "Traceback" not in logs.stdout + logs.stderr, (logs.stdout + logs.stderr)[-3000:]
    assert container not in _docker("ps", "--all", "--no-trunc", "--format", "{{.ID}}")


def _speech_pcm16(seconds: float) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def test_the_container_serves_health_chat_audio_and_a_realtime_turn(container: Container) -> None:
    container_url = container.url
    health = httpx.get(container_url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["random_weights"] is True, health

    client = openai.OpenAI(base_url=container_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me about the sea."}],
        modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}, max_tokens=6)
    with wave.open(io.BytesIO(base64.b64decode(reply.choices[0].message.audio.data))) as wav:
        assert wav.getframerate() == RATE and wav.getnframes() > 0

    events = asyncio.run(_realtime_turn(container_url.replace("http://", "ws://") + "/v1/realtime?model=tiny"))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "session.created" and "response.output_audio.delta" in kinds, kinds
    assert events[-1]["type"] == "response.done" and events[-1]["response"]["status"] == "completed", events[-1]


async def _realtime_turn(url: str) -> list[dict]:
    """One manual turn: a second of audio in, committed, a response asked for and read to its end."""
    events: list[dict] = []
    async with websockets.connect(url, max_size=None) as ws:
        events.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(_speech_pcm16(1.0)).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        await _read_to_response_done(ws, events)
    return events


def _spoken_pcm16(text: str) -> bytes:
    """`text` spoken by espeak-ng (scripts/test.sh installs it), as 24 kHz PCM16."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, timeout=60)
        samples, rate = soundfile.read(wav, dtype="float32")
    return (np.clip(soxr.resample(samples, rate, RATE), -1, 1) * 32767).astype("<i2").tobytes()


def test_semantic_vad_ends_a_spoken_turn_on_the_smart_turn_model(container: Container) -> None:
    url = container.url.replace("http://", "ws://") + "/v1/realtime?model=tiny"
    speech = _spoken_pcm16("What is the weather like in Paris today?")
    events = asyncio.run(_semantic_turn(url, speech + bytes(2 * RATE * 3)))  # then 3 s of silence
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" in kinds and "input_audio_buffer.committed" in kinds, kinds
    assert events[-1]["type"] == "response.done" and events[-1]["response"]["status"] == "completed", events[-1]
    # the turn ended on the model, not on the server VAD's fallback: the file the image installed loaded and ran
    logs = container.logs()
    assert "no Smart Turn model" not in logs and "onnxruntime is not installed" not in logs, logs[-3000:]
    loaded = [line for line in logs.splitlines() if "semantic_vad: Smart Turn model" in line and "loaded" in line]
    assert loaded and "smart-turn-v3" in loaded[0] and loaded[0].rstrip().endswith(".onnx loaded"), logs[-3000:]
    assert "semantic_vad: Smart Turn's first decision in this process: P(complete)=" in logs, logs[-3000:]


async def _semantic_turn(url: str, pcm16: bytes) -> list[dict]:
    """A spoken turn under `semantic_vad`: audio in 100 ms appends, the response the turn's end starts, read to its
    end."""
    events: list[dict] = []
    async with websockets.connect(url, max_size=None) as ws:
        events.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}}))
        step = 2 * RATE // 10
        for start in range(0, len(pcm16), step):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm16[start:start + step]).decode()}))
        await _read_to_response_done(ws, events)
    return events


async def _read_to_response_done(ws: websockets.ClientConnection, events: list[dict]) -> None:
    """The session's JSON events appended to `events` until a `response.done` (binary messages skipped)."""
    async with asyncio.timeout(120):
        while events[-1]["type"] != "response.done":
            message = await ws.recv()
            if isinstance(message, str):
                events.append(json.loads(message))


def test_the_image_serves_the_assistant_by_default(assistant_container: Container) -> None:
    model = httpx.get(assistant_container.url + "/v1/models", timeout=10).json()["data"][0]
    assert model["id"] == "assistant" and model["random_weights"] is False, model
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "question.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), "What is the capital of France?"], check=True)
        data = base64.b64encode(wav.read_bytes()).decode()
    client = openai.OpenAI(base_url=assistant_container.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="assistant", modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}, seed=1,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}])
    assert "paris" in reply.choices[0].message.audio.transcript.lower(), reply.choices[0].message.audio.transcript
