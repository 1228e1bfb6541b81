"""Realtime function calling and input transcription on a Session over the tiny engine: the events and items,
the history they make for the next prompt, and the error paths of bad tools.

The tiny model's weights are random: its calls validate only because `tool_choice: "required"` decodes
them under a grammar, and its transcripts are gibberish, but real events of the right shape."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from engine import Engine, Message, TextPart, ToolCall, create_engine, load_profile
from tests.session_events import drain, send
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.events import Dialect
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session

pytestmark = pytest.mark.asyncio(loop_scope="session")

LAMP = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": False}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "set_lamp", "description": "Switch the lamp", "parameters": LAMP},
    {"type": "function", "name": "get_weather", "parameters": WEATHER},
]
SCHEMAS = {"set_lamp": LAMP, "get_weather": WEATHER}


@pytest.fixture(scope="module")
async def engine(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[Engine]:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await engine.start()
    yield engine
    await engine.stop()



async def new_session(engine: Engine, dialect: Dialect = Dialect.GA, **settings: Any) -> Session:
    session = Session(engine, GatewayConfig(), dialect, GatewayMetrics(), "test")
    session.open()
    drain(session)
    manual = {"turn_detection": None} if dialect is Dialect.BETA else {"audio": {"input": {"turn_detection": None}}}
    events = await send(session, type="session.update", session={**manual, **settings})
    assert [e["type"] for e in events] == ["session.updated"], events
    return session


async def reply(session: Session, **response: Any) -> list[dict[str, Any]]:
    await deliver(session, json.dumps({"type": "response.create", **({"response": response} if response else {})}))
    assert session.response is not None and session.response.task is not None
    await asyncio.wait_for(session.response.task, 120)
    return drain(session)


def user_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_a_required_call_round_trip(engine: Engine) -> None:
    session = await new_session(engine, output_modalities=["text"], tools=TOOLS, tool_choice="required",
                                max_output_tokens=120)
    await send(session, type="conversation.item.create", item=user_text("Turn the lamp on."))
    events = await reply(session)
    types = [e["type"] for e in events]
    assert "response.output_text.delta" not in types and "response.content_part.added" not in types
    done = events[-1]["response"]
    assert done["status"] == "completed", done
    calls = done["output"]
    assert calls and all(c["type"] == "function_call" and c["status"] == "completed" for c in calls)
    for index, call in enumerate(calls):
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        mine = [e for e in events if e.get("item_id") == call["id"] or e.get("item", {}).get("id") == call["id"]]
        assert [e["type"] for e in mine][:2] == ["response.output_item.added", "conversation.item.added"]
        assert mine[0]["item"]["arguments"] == "" and mine[0]["output_index"] == index
        deltas = [e for e in mine if e["type"] == "response.function_call_arguments.delta"]
        assert "".join(d["delta"] for d in deltas) == call["arguments"]
        assert all(d["call_id"] == call["call_id"] and d["output_index"] == index for d in deltas)
        assert [e["type"] for e in mine][-3:] == ["response.function_call_arguments.done",
                                                  "response.output_item.done", "conversation.item.done"]
        assert mine[-3]["arguments"] == call["arguments"] and mine[-3]["name"] == call["name"]
    # the client runs the first call and sends its result back; the next reply hears it
    first = calls[0]
    added = await send(session, type="conversation.item.create", item={
        "type": "function_call_output", "call_id": first["call_id"], "output": '{"ok": true}'})
    assert added[0]["item"]["type"] == "function_call_output" and added[0]["item"]["call_id"] == first["call_id"]
    prompt = session.conversation.prompt(ev.SessionConfig())
    assert prompt[1] == Message("assistant", (), tuple(ToolCall(c["name"], c["arguments"]) for c in calls))
    assert prompt[2] == Message("tool", (TextPart('{"ok": true}'),))
    events = await reply(session, tool_choice="none", max_output_tokens=8)
    done = events[-1]["response"]
    assert done["status"] == "completed" and [o["type"] for o in done["output"]] == ["message"]
    assert done["usage"]["input_tokens"] > 0
    await session.close()


async def test_a_named_call_in_audio_is_not_spoken(engine: Engine) -> None:
    session = await new_session(engine, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"})
    await send(session, type="conversation.item.create", item=user_text("Weather in Paris?"))
    events = await reply(session)
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert [(o["type"], o["name"]) for o in done["output"]] == [("function_call", "get_weather")] * len(done["output"])
    assert not [e for e in events if e["type"].startswith("response.output_audio")]
    assert done["usage"]["output_token_details"]["audio_tokens"] == 0
    await session.close()


async def test_function_items_from_the_client(engine: Engine) -> None:
    session = await new_session(engine)
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "set_lamp", "arguments": '{"on": true}'}
    [added, done] = await send(session, type="conversation.item.create", item=call)
    assert added["type"] == "conversation.item.added" and done["type"] == "conversation.item.done"
    assert added["item"] == {**call, "object": "realtime.item", "status": "completed"}
    await send(session, type="conversation.item.create", item={
        "type": "function_call_output", "id": "out_1", "call_id": "call_1", "output": "done"})
    [retrieved] = await send(session, type="conversation.item.retrieve", item_id="out_1")
    assert retrieved["item"] == {"id": "out_1", "type": "function_call_output", "object": "realtime.item",
                                 "status": "completed", "call_id": "call_1", "output": "done"}
    [error] = await send(session, type="conversation.item.create", event_id="e1",
                         item={"type": "function_call_output", "output": "no call"})
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "item.call_id")
    await session.close()


@pytest.mark.parametrize(
    ("settings", "param", "code"),
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "frobnicate"}}]},
         "session.tools.0.parameters", "invalid_function_parameters"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "session.tools.0.type", "invalid_value"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "session.tools.1.name", "invalid_value"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "teleport"}}, "session.tool_choice.name",
         "invalid_value"),
        ({"tool_choice": "sometimes"}, "session.tool_choice", "invalid_value"),
    ],
)
async def test_bad_tools_reject_those_settings_only(engine: Engine, settings: dict[str, Any], param: str,
                                                    code: str) -> None:
    session = await new_session(engine)
    events = await send(session, type="session.update", event_id="u1", session={**settings, "instructions": "Hi."})
    assert [e["type"] for e in events][-2:] == ["error", "session.updated"], events
    error = events[0]["error"]  # an MCP tool is also missing a name: one error each, the first for its type
    assert (error["param"], error["code"], error["event_id"]) == (param, code, "u1"), error
    assert session.config.instructions == "Hi." and session.config.tool_choice == "auto"
    if param != "session.tool_choice.name":
        assert session.config.tools == ()
    await session.close()


async def test_a_call_required_before_the_tools_waits_for_them(engine: Engine) -> None:
    """Pipecat's order: the settings' tool choice in one session.update, its context's tools in the next."""
    session = await new_session(engine)
    events = await send(session, type="session.update", session={"tool_choice": "required"})
    assert [e["type"] for e in events] == ["session.updated"], events
    [error] = await send(session, type="response.create", event_id="r1")
    assert (error["error"]["param"], error["error"]["code"]) == ("response.tool_choice", "invalid_value")
    assert session.response is None
    await send(session, type="session.update", session={"tools": TOOLS})
    assert session.config.tool_choice == "required" and len(session.config.tools) == len(TOOLS)
    await session.close()


async def test_bad_tools_refuse_that_response(engine: Engine) -> None:
    session = await new_session(engine, tools=TOOLS)
    events = await send(session, type="response.create", event_id="r1", response={
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "minProperties": "x"}}]})
    assert [e["type"] for e in events] == ["error"] and session.response is None
    assert events[0]["error"]["param"] == "response.tools.0.parameters"
    [error] = await send(session, type="response.create", response={"tool_choice": {"type": "function", "name": "g"}})
    assert error["error"]["param"] == "response.tool_choice.name"
    await session.close()


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
async def test_committed_audio_is_transcribed(engine: Engine, dialect: Dialect) -> None:
    settings = {"model": "whisper-1", "language": "en"}
    on = {"input_audio_transcription": settings} if dialect is Dialect.BETA else {
        "audio": {"input": {"transcription": settings, "turn_detection": None}}}
    session = await new_session(engine, dialect, **on)
    assert session.config.transcription is not None and session.config.transcription.model == "whisper-1"
    noise = (np.random.default_rng(0).standard_normal(24_000) * 0.1 * 32767).astype("<i2").tobytes()
    await send(session, type="input_audio_buffer.append", audio=base64.b64encode(noise).decode())
    committed = await send(session, type="input_audio_buffer.commit")
    item_id = committed[0]["item_id"]
    assert session.transcriber.tasks
    await asyncio.wait_for(asyncio.gather(*session.transcriber.tasks.values()), 60)
    events = drain(session)
    deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    [completed] = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert deltas and all(d["item_id"] == item_id and d["content_index"] == 0 for d in deltas)
    assert completed["transcript"] == "".join(d["delta"] for d in deltas)
    usage = completed["usage"]
    assert usage["type"] == "tokens" and usage["input_token_details"]["audio_tokens"] >= 13
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    [retrieved] = await send(session, type="conversation.item.retrieve", item_id=item_id)
    assert retrieved["item"]["content"] == [{"type": "input_audio", "transcript": completed["transcript"]}]
    off = {"input_audio_transcription": None} if dialect is Dialect.BETA else {"audio": {"input": {"transcription": None}}}
    await send(session, type="session.update", session=off)
    assert session.config.transcription is None
    await send(session, type="input_audio_buffer.append", audio=base64.b64encode(noise).decode())
    await send(session, type="input_audio_buffer.commit")
    assert not session.transcriber.tasks
    await session.close()



async def test_an_async_tool_result_after_a_barge_in_joins_the_conversation(engine: Engine) -> None:
    """A slow tool: its call completes, the user speaks again and cuts the next reply off, and only then
    does the result come. It is taken, and the reply after hears the call, the later turn and the result."""
    session = await new_session(engine, output_modalities=["text"], tools=TOOLS, tool_choice="required",
                                max_output_tokens=120)
    await send(session, type="conversation.item.create", item=user_text("What is the weather in Oslo?"))
    [call] = (await reply(session))[-1]["response"]["output"]
    assert call["type"] == "function_call" and call["status"] == "completed"
    await send(session, type="conversation.item.create", item=user_text("Also, switch the lamp off."))
    await deliver(session, json.dumps({"type": "response.create", "response": {"tool_choice": "none",
                                                                               "max_output_tokens": 400}}))
    assert session.response is not None and session.response.task is not None
    task = session.response.task
    events = await send(session, type="response.cancel")  # the user talks over it
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 60)
    done = [e for e in [*events, *drain(session)] if e["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["cancelled"], [e["type"] for e in events]
    added = await send(session, type="conversation.item.create", item={
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"forecast": "rain"}'})
    assert [e["type"] for e in added] == ["conversation.item.added", "conversation.item.done"], added
    prompt = session.conversation.prompt(session.settings.config)
    roles = [m.role for m in prompt]
    assert roles[:3] == ["user", "assistant", "user"] and roles[-1] == "tool", roles
    assert prompt[1].tool_calls == (ToolCall(call["name"], call["arguments"]),)
    assert prompt[-1] == Message("tool", (TextPart('{"forecast": "rain"}'),))
    done = (await reply(session, tool_choice="none", max_output_tokens=8))[-1]["response"]
    assert done["status"] == "completed", done
    await session.close()
