"""`voice-gateway serve assistant` on loopback, driven by the official openai SDK: a spoken question over chat
completions and over a realtime session is heard (the session's input transcription is the ears' words) and
answered, in the voice an OpenAI name asks for."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.conftest import Server, start_server, stop_server
from tests.integration.test_realtime import append_audio, client_for, events_until, silence
from voice_gateway.audio.resample import resample

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def assistant_server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, server = start_server(cache_dir, tmp_path_factory.mktemp("assistant") / "server.log", model="assistant")
    yield server
    stop_server(proc)


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("question") / "question.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), QUESTION], check=True)
    return path


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def test_models_name_the_cascade(assistant_server: Server) -> None:
    model = assistant_server.get("/v1/models").json()["data"][0]
    assert model["id"] == "assistant" and model["random_weights"] is False and model["voices"] == ["joe"]
    assert "Whisper" in model["description"] and "SmolLM2" in model["description"]
    assert model["input_modalities"] == ["text", "audio"]
    assert model["listens_ahead"] is True  # its ears make speech text first: sessions take turns by the words


def test_a_spoken_question_over_chat_is_answered(assistant_server: Server, question_wav: Path) -> None:
    client = openai.OpenAI(base_url=assistant_server.base_url + "/v1", api_key="unused", max_retries=0)
    data = base64.b64encode(question_wav.read_bytes()).decode()
    reply = client.chat.completions.create(
        model="assistant", modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}, seed=1,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}])
    audio = reply.choices[0].message.audio
    assert audio is not None and "paris" in words(audio.transcript), audio.transcript
    samples, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)))
    assert rate == 24_000 and len(samples) / rate > 0.5


async def test_a_spoken_turn_over_realtime_is_heard_and_answered(assistant_server: Server, question_wav: Path) -> None:
    samples, rate = sf.read(question_wav, dtype="float32")
    speech = resample(samples, rate, 24_000)
    async with client_for(assistant_server) as client:
        async with client.realtime.connect(model="assistant") as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={
                "type": "realtime", "audio": {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}},
                                              "output": {"voice": "marin"}}})
            await append_audio(conn, np.concatenate([speech, silence(0.3)]))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            events = await events_until(conn, "response.done", timeout_s=120)
            heard = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
            if not heard:  # the transcription may finish after the reply
                heard = [e for e in await events_until(conn, "conversation.item.input_audio_transcription.completed")
                         if e.type == "conversation.item.input_audio_transcription.completed"]
    assert {"capital", "france"} <= set(words(heard[0].transcript)), heard[0].transcript
    done = events[-1].response
    assert done.status == "completed", done
    said = done.output[0].content[0].transcript  # sampled at the session's temperature: English, not always right
    assert len([w for w in words(said) if w.replace("'", "").isalpha()]) >= 3, said  # "L'Alma" is a word
    assert any(e.type == "response.output_audio.delta" for e in events)


PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
       "RU5ErkJggg==")


async def test_the_assistant_says_it_takes_no_images(assistant_server: Server) -> None:
    """Its language model has no eyes: an image is refused with its own code, in chat and in realtime, and the
    session goes on."""
    client = openai.OpenAI(base_url=assistant_server.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="assistant", messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": PNG}}]}])
    assert refused.value.code == "images_not_supported" and "takes no images" in refused.value.message
    async with client_for(assistant_server) as realtime:
        async with realtime.realtime.connect(model="assistant") as conn:
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": PNG}]})
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Hello"}]})
            seen = await events_until(conn, "conversation.item.done")
    errors = [e for e in seen if e.type == "error"]
    assert [e.error.code for e in errors] == ["images_not_supported"], seen


async def test_a_session_starts_at_the_models_own_temperature(assistant_server: Server) -> None:
    """Not OpenAI's 0.8: the assistant's profile samples at 0.3, and its sessions start there."""
    async with client_for(assistant_server) as client:
        async with client.beta.realtime.connect(model="assistant") as conn:
            created = await conn.recv()
    assert created.type == "session.created" and created.session.temperature == 0.3, created


async def test_barge_in_cancels_the_reply_in_every_stage(assistant_server: Server, tmp_path: Path) -> None:
    """The user speaks over a long answer: server VAD cancels it (`turn_detected`), no audio of it follows, and the
    engine lets go of it in the ears, the language model and the voice alike."""
    story = tmp_path / "story.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(story), "Tell me a long story about a dragon and a knight."],
                   check=True)
    samples, rate = sf.read(story, dtype="float32")
    speech = resample(samples, rate, 24_000)
    async with client_for(assistant_server) as client, client.realtime.connect(model="assistant") as conn:
        await conn.recv()
        # the turn that barges in makes no reply of its own, so that nothing is left running after the cancel
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 300, "audio": {"input": {
            "turn_detection": {"type": "server_vad", "create_response": False, "interrupt_response": True}}}})
        await append_audio(conn, np.concatenate([silence(0.3), speech, silence(1.0)]))
        await events_until(conn, "input_audio_buffer.committed", timeout_s=60)
        await conn.response.create()
        async with asyncio.timeout(120):
            async for event in conn:
                if event.type == "response.output_audio.delta":
                    response_id = event.response_id
                    break
        await append_audio(conn, speech)  # the user talks over the reply
        after = await events_until(conn, "response.done", timeout_s=120)
    done = after[-1].response
    assert done.id == response_id and done.status == "cancelled", done
    assert done.status_details.reason == "turn_detected"
    cut = next(i for i, e in enumerate(after) if e.type == "input_audio_buffer.speech_started")
    assert not [e for e in after[cut:] if e.type == "response.output_audio.delta" and e.response_id == response_id]
    deadline = time.monotonic() + 10
    while not (settled := _released(assistant_server)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert settled, (assistant_server.get("/health").json(), assistant_server.get("/metrics").text[-3000:])


def _released(server: Server) -> bool:
    """No request is active and neither the language model's stage nor the voice's holds one."""
    metrics = server.get("/metrics").text
    return server.get("/health").json()["active_requests"] == 0 and all(
        re.search(rf'^engine_stage_running\{{stage="{stage}"\}} 0\.0$', metrics, re.M) for stage in ("thinker", "speak"))


def test_a_required_tool_call_is_made_and_not_spoken(assistant_server: Server) -> None:
    """Constrained decoding works on any model: asked for the lamp, the 135M model calls it with valid arguments,
    and its voice says nothing of the call."""
    client = openai.OpenAI(base_url=assistant_server.base_url + "/v1", api_key="unused", max_retries=0)
    lamp = {"type": "function", "function": {"name": "set_lamp", "description": "Switch the lamp on or off.",
                                             "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                                            "required": ["on"]}}}
    reply = client.chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": "Switch the lamp on, please."}], tools=[lamp],
        tool_choice={"type": "function", "function": {"name": "set_lamp"}}, modalities=["text", "audio"],
        audio={"voice": "joe", "format": "wav"})
    message = reply.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "set_lamp", message
    assert isinstance(__import__("json").loads(message.tool_calls[0].function.arguments)["on"], bool)
    spoken = message.audio.transcript if message.audio else ""
    assert "set_lamp" not in spoken and "tool_call" not in spoken, spoken
