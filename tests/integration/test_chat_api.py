"""The official openai client against a live server on loopback (tiny model)."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.conftest import Server

SAMPLES_PER_FRAME = 1920
CODE2WAV_TAIL_SAMPLES = 555  # Qwen3-Omni's Code2Wav drops this causal tail on every call
AUDIO = {"voice": "ethan", "format": "pcm16"}
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def wait_idle(server: Server, within_s: float) -> dict:
    deadline = time.monotonic() + within_s
    while True:
        health = server.get("/health").json()
        if health["active_requests"] == 0 and not any(health["stage_load"].values()):
            return health
        if time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_models_say_the_weights_are_random(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].model_extra["random_weights"] is True
    assert "noise" in models[0].model_extra["description"]
    assert models[0].model_extra["input_modalities"] == ["text", "audio", "image"]
    assert models[0].model_extra["listens_ahead"] is False  # the Thinker hears audio itself


def test_text_only(client: openai.OpenAI, server: Server) -> None:
    before = server.get("/metrics").text
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, seed=1)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.message.audio is None
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= reply.usage.completion_tokens <= 8
    # text-only requests never reach the Talker or Code2Wav
    after = server.get("/metrics").text
    assert _metric(after, 'engine_stage_batch_size_count{stage="talker"}') == _metric(
        before, 'engine_stage_batch_size_count{stage="talker"}'
    )


def test_openai_voice_names_speak_in_chat_too(client: openai.OpenAI) -> None:
    """A client written for OpenAI's chat audio asks for `alloy`: it is mapped as realtime maps it."""
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, modalities=["text", "audio"],
                                           audio={"voice": "alloy", "format": "wav"}, max_tokens=2)
    assert reply.choices[0].message.audio is not None and reply.choices[0].message.audio.data


def test_audio_wav_matches_the_codec_frames(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="tiny", messages=MESSAGES, modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}, seed=3
    )
    audio = reply.choices[0].message.audio
    assert audio is not None and audio.id and audio.expires_at > time.time()
    assert audio.transcript
    samples, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)))
    frames = reply.usage.completion_tokens_details.audio_tokens
    assert rate == 24_000 and samples.ndim == 1
    assert frames > 0
    assert len(samples) == frames * SAMPLES_PER_FRAME - CODE2WAV_TAIL_SAMPLES
    assert np.abs(samples).max() > 0.01  # audible noise, not silence


def test_streamed_audio_equals_the_one_shot_reply(client: openai.OpenAI) -> None:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, modalities=["text", "audio"], audio=AUDIO, stream=True, seed=11,
        stream_options={"include_usage": True},
    )
    pieces: list[bytes] = []
    arrivals: list[float] = []
    transcript, finish_reasons, usage = "", [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        audio = _delta_audio(delta)
        if audio and audio.get("data"):
            pieces.append(base64.b64decode(audio["data"]))
            arrivals.append(time.perf_counter() - started)
        if audio and audio.get("transcript"):
            transcript += audio["transcript"]
        if chunk.choices[0].finish_reason:
            finish_reasons.append(chunk.choices[0].finish_reason)
    ended = time.perf_counter() - started
    assert len(pieces) >= 2
    assert arrivals[0] < arrivals[-1] < ended
    assert len(finish_reasons) == 1 and transcript
    streamed = np.frombuffer(b"".join(pieces), dtype="<i2").astype(np.float32) / 32768
    assert usage is not None
    assert len(streamed) == usage.completion_tokens_details.audio_tokens * SAMPLES_PER_FRAME - CODE2WAV_TAIL_SAMPLES

    one_shot = client.chat.completions.create(model="tiny", messages=MESSAGES, modalities=["text", "audio"], audio=AUDIO, seed=11)
    whole = np.frombuffer(base64.b64decode(one_shot.choices[0].message.audio.data), dtype="<i2").astype(np.float32) / 32768
    assert one_shot.choices[0].message.audio.transcript == transcript
    assert whole.shape == streamed.shape
    assert np.abs(whole - streamed).max() <= 1e-3


async def test_eight_concurrent_streams_share_talker_batches(server: Server) -> None:
    async def one(aclient: openai.AsyncOpenAI, i: int) -> int:
        stream = await aclient.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"request {i}"}], modalities=["text", "audio"],
            audio=AUDIO, stream=True, seed=i,
        )
        audio_bytes, finished = 0, 0
        async for chunk in stream:
            if chunk.choices:
                audio = _delta_audio(chunk.choices[0].delta)
                audio_bytes += len(base64.b64decode(audio.get("data", "")))
                finished += bool(chunk.choices[0].finish_reason)
        assert finished == 1
        return audio_bytes

    async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as aclient:
        sizes = await asyncio.gather(*(one(aclient, i) for i in range(8)))
    assert all(size > 0 for size in sizes)
    metrics = server.get("/metrics").text
    batched = _metric(metrics, 'engine_stage_batch_size_count{stage="talker"}') - _metric(
        metrics, 'engine_stage_batch_size_bucket{le="1.0",stage="talker"}'
    )
    assert batched > 0, "the Talker never ran more than one request in a forward"


def test_client_disconnect_frees_the_engine(server: Server) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "modalities": ["text", "audio"], "audio": AUDIO, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if '"data"' in line:  # the first audio piece
                    assert server.get("/health").json()["active_requests"] == 1
                    break
    health = wait_idle(server, within_s=1.0)
    assert health["active_requests"] == 0, health
    assert not any(health["stage_load"].values()), health


def test_non_streaming_client_that_hangs_up_frees_the_engine(server: Server) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    health = wait_idle(server, within_s=1.0)
    assert health["active_requests"] == 0, health
    assert not any(health["stage_load"].values()), health
    assert "went away" in server.log()


def _wav_b64(samples: np.ndarray, rate: int) -> str:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


def test_audio_input_goes_through_the_audio_encoder(client: openai.OpenAI) -> None:
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(48_000) / 48_000)).astype(np.float32)
    content = [{"type": "input_audio", "input_audio": {"data": _wav_b64(tone, 48_000), "format": "wav"}},
               {"type": "text", "text": "What is this?"}]
    short = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is this?"}], max_tokens=4)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], max_tokens=4)
    # one second of audio is 13 audio-encoder frames, plus its start/end markers
    assert reply.usage.prompt_tokens - short.usage.prompt_tokens == 13 + 2
    assert reply.usage.prompt_tokens_details.audio_tokens == 13
    assert reply.choices[0].message.content


@pytest.mark.parametrize(
    ("patch", "status", "param"),
    [
        ({"model": "gpt-4o"}, 404, "model"),
        ({"modalities": ["video"]}, 400, None),
        ({"modalities": ["audio"]}, 400, "modalities"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": -3}, 400, "max_tokens"),
        ({"audio": {"voice": "nobody", "format": "wav"}, "modalities": ["text", "audio"]}, 400, "audio.voice"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "@@not base64@@", "format": "wav"}}]}]}, 400, None),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF garbage that is no wav").decode(), "format": "wav"}}]}]}, 400, None),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, None),
        ({"messages": []}, 400, "messages"),
    ],
)
def test_bad_input_gets_an_openai_error_and_the_server_lives_on(
    server: Server, client: openai.OpenAI, patch: dict, status: int, param: str | None
) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4} | patch
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if param:
        assert error["param"] == param
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(**body)
    assert raised.value.status_code == status
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert ok.choices[0].message.content is not None


def test_prompt_over_the_context_says_so(server: Server) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 3000}]}
    error = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30).json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "1024" in error["message"]


def _delta_audio(delta) -> dict:
    """delta.audio as a dict: typed by newer openai clients, an extra field in older ones."""
    audio = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio") or {}
    return audio if isinstance(audio, dict) else audio.model_dump(exclude_none=True)


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0
