"""Realtime function calling and input transcription through the official openai SDK, on the live tiny server.

The tiny model's weights are random: its call validates only because `tool_choice: "required"` decodes
it under a grammar; its transcript is gibberish, but the events are real and of the SDK's types."""

from __future__ import annotations

import asyncio
import json
import subprocess

import jsonschema
import numpy as np
import pytest
import soundfile as sf
from openai.types import realtime as ga

from tests.conftest import Server
from tests.integration.test_realtime import RATE, append_audio, client_for, events_until, silence
from voice_gateway.audio.resample import resample

LAMP = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "set_lamp", "description": "Switch the lamp", "parameters": LAMP}]


async def test_a_function_call_round_trip(server: Server) -> None:
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        # a schema the grammar engine cannot take is refused by its param, and the rest of the update applies
        await conn.session.update(session={"type": "realtime", "instructions": "You switch lamps.", "tools": [
            {"type": "function", "name": "set_lamp", "parameters": {"type": "frobnicate"}}]})
        error, updated = await conn.recv(), await conn.recv()
        assert isinstance(error, ga.RealtimeErrorEvent) and error.error.param == "session.tools.0.parameters"
        assert isinstance(updated, ga.SessionUpdatedEvent) and updated.session.instructions == "You switch lamps."
        # room for a whole call: a call cut off by the length limit ends incomplete
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": TOOLS,
                                           "tool_choice": "required", "max_output_tokens": 120,
                                           "audio": {"input": {"turn_detection": None}}})
        updated = await conn.recv()
        assert isinstance(updated, ga.SessionUpdatedEvent) and updated.session.tool_choice == "required"
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Lamp on, please."}]})
        await conn.response.create()
        events = await events_until(conn, "response.done")
        done = events[-1].response
        assert done.status == "completed"
        assert done.output and all(isinstance(o, ga.RealtimeConversationItemFunctionCall) for o in done.output)
        call = done.output[0]
        assert call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), LAMP)
        arguments = [e for e in events if isinstance(e, ga.ResponseFunctionCallArgumentsDoneEvent)]
        assert arguments[0].call_id == call.call_id and arguments[0].arguments == call.arguments
        assert not [e for e in events if e.type == "response.output_text.delta"]
        # the client runs it and sends the result; the next reply is words
        await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                  "output": json.dumps({"lamp": "on"})})
        await conn.response.create(response={"tool_choice": "none", "max_output_tokens": 8})
        events = await events_until(conn, "response.done")
    added = next(e for e in events if e.type == "conversation.item.added")
    assert isinstance(added.item, ga.RealtimeConversationItemFunctionCallOutput)
    done = events[-1].response
    assert done.status == "completed" and [o.type for o in done.output] == ["message"]


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    path = tmp_path_factory.mktemp("question") / "question.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Is the lamp on?"], check=True)
    samples, rate = sf.read(path, dtype="float32")
    return resample(samples, rate, RATE)


async def test_a_spoken_turn_is_transcribed(server: Server, question: np.ndarray) -> None:
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 8,
                                           "audio": {"input": {"transcription": {"model": "gpt-4o-mini-transcribe"}}}})
        updated = await conn.recv()
        assert updated.session.audio.input.transcription.model == "gpt-4o-mini-transcribe"
        await append_audio(conn, np.concatenate([silence(0.3), question, silence(0.8)]))
        wanted = {"response.done", "conversation.item.input_audio_transcription.completed"}
        events: list = []
        async with asyncio.timeout(90):
            async for event in conn:  # the transcript and the reply run side by side: either may end first
                events.append(event)
                if wanted <= {e.type for e in events}:
                    break
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    deltas = [e for e in events if isinstance(e, ga.ConversationItemInputAudioTranscriptionDeltaEvent)]
    completed = next(e for e in events if isinstance(e, ga.ConversationItemInputAudioTranscriptionCompletedEvent))
    assert completed.item_id == committed.item_id and all(d.item_id == committed.item_id for d in deltas)
    assert completed.transcript == "".join(d.delta or "" for d in deltas)
    usage = completed.usage
    assert isinstance(usage, ga.conversation_item_input_audio_transcription_completed_event.UsageTranscriptTextUsageTokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_token_details is not None and usage.input_token_details.audio_tokens
    assert events[-1].type in wanted
    assert not [e for e in events if e.type in ("error", "conversation.item.input_audio_transcription.failed")]
