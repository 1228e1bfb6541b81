"""A live server whose engine runs in a child process (`engine: process`), through the official openai
client: streamed text and audio, the engine's refusals as OpenAI errors, hang-ups, /health and /metrics."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engine.profile import CONFIG_DIR
from tests.conftest import Server, start_server, stop_server
from tests.integration.test_chat_api import _delta_audio, _wav_b64

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
AUDIO = {"voice": "ethan", "format": "pcm16"}


@pytest.fixture(scope="module")
def process_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("engine-process")
    profile = {**yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text()), "engine": {"where": "process"}}
    (folder / "tiny-process.yaml").write_text(yaml.safe_dump(profile))
    proc, srv = start_server(cache_dir, folder / "server.log", "--deploy-config", str(folder / "tiny-process.yaml"))
    yield srv
    stop_server(proc)
    assert "engine process" in srv.log() and "Traceback" not in srv.log()


@pytest.fixture
def client(process_server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=process_server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def _engine_samples(server: Server) -> dict[str, float]:
    text = server.get("/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_streamed_reply_and_metrics_from_the_child(client: openai.OpenAI, process_server: Server) -> None:
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, modalities=["text", "audio"], audio=AUDIO,
                                            stream=True, stream_options={"include_usage": True})
    text, pcm, usage = "", b"", None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            audio = _delta_audio(choice.delta)
            text += audio.get("transcript") or ""
            pcm += base64.b64decode(audio.get("data") or "")
    assert text and usage is not None and usage.completion_tokens > 0
    frames = usage.completion_tokens_details.audio_tokens
    assert frames > 0 and len(pcm) > 0
    deadline = time.monotonic() + 5  # the child pushes its metrics every quarter second
    while _engine_samples(process_server).get("engine_requests_total", 0) < 1:  # counted when the reply ends
        assert time.monotonic() < deadline, "the engine's metrics never reached /metrics"
        time.sleep(0.1)
    assert _engine_samples(process_server)["engine_ttfp_seconds_count"] >= 1


def test_engine_refusal_is_an_openai_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="unknown voice"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, modalities=["text", "audio"],
                                       audio={"voice": "nobody", "format": "wav"})
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES)  # and the server lives on
    assert reply.choices[0].message.content


def test_hang_up_frees_the_child(process_server: Server) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "modalities": ["text", "audio"], "audio": AUDIO, "stream": True,
            "max_tokens": 200}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", process_server.base_url + "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if '"data"' in line:
                    assert process_server.get("/health").json()["active_requests"] == 1
                    break
    deadline = time.monotonic() + 3
    while True:
        health = process_server.get("/health").json()
        if health["active_requests"] == 0 and not any(health["stage_load"].values()):
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def test_audio_input_is_prepared_in_the_server_process(client: openai.OpenAI) -> None:
    """Input audio's features are made in the server's process (its front door), then sent to the child."""
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(48_000) / 48_000)).astype(np.float32)
    content = [{"type": "input_audio", "input_audio": {"data": _wav_b64(tone, 48_000), "format": "wav"}},
               {"type": "text", "text": "What is this?"}]
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], max_tokens=4)
    assert reply.usage.prompt_tokens_details.audio_tokens == 13  # one second of audio: 13 encoder frames
    assert reply.choices[0].message.content
    blip = [{"type": "input_audio", "input_audio": {"data": _wav_b64(tone[:100], 48_000), "format": "wav"}}]
    with pytest.raises(openai.BadRequestError, match="at least 10 ms"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": blip}], max_tokens=4)


@pytest.fixture(scope="module")
def workers_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two workers from the profile's `http_workers`, as the GPU profile serves (`--http-workers` beats it)."""
    folder = tmp_path_factory.mktemp("http-workers")
    profile = {**yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text()), "engine": {"http_workers": 2}}
    (folder / "tiny-workers.yaml").write_text(yaml.safe_dump(profile))
    proc, srv = start_server(cache_dir, folder / "server.log", "--deploy-config", str(folder / "tiny-workers.yaml"))
    yield srv
    stop_server(proc)
    assert srv.log().count("engine process attached") == 2, srv.log()[-3000:]
    assert "Traceback" not in srv.log()


async def test_two_server_processes_in_front_of_one_engine(workers_server: Server) -> None:
    async with openai.AsyncOpenAI(base_url=workers_server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        async def one(i: int) -> int:
            reply = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"#{i} tell me about the sea"}],
                modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}, max_tokens=6)
            return reply.usage.completion_tokens_details.audio_tokens

        frames = await asyncio.gather(*(one(i) for i in range(8)))
        assert all(f > 0 for f in frames)
        with pytest.raises(openai.BadRequestError, match="unknown voice"):
            await client.chat.completions.create(model="tiny", messages=MESSAGES, modalities=["text", "audio"],
                                                 audio={"voice": "nobody", "format": "wav"})
    assert workers_server.get("/health").json()["status"] == "ok"
