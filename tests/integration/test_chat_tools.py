"""Function calling and structured output through the official openai client, on the live tiny server.

The tiny model's weights are random: the calls and JSON it makes are valid only because the
Thinker decodes them under a grammar. Schemas keep strings short and objects closed, or a random
model would write one string forever."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from tests.conftest import Server

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
LAMP = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast for a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "set_lamp", "parameters": LAMP}},
]
SCHEMAS = {"get_weather": WEATHER, "set_lamp": LAMP}
MESSAGES = [{"role": "user", "content": "What's the weather in Paris for three days?"}]


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_required_tool_call_validates(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=300, seed=1)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].id.startswith("call_") and calls[0].type == "function"
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[calls[0].function.name])


def test_streamed_named_tool_call_validates(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False, max_tokens=300, seed=2, stream=True,
    )
    calls: dict[int, dict] = {}
    finish = []
    for chunk in stream:
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or ():
            if delta.id is not None:  # a call's first delta: its id, type and name
                assert delta.index not in calls and delta.type == "function"
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        if choice.finish_reason:
            finish.append(choice.finish_reason)
    assert finish == ["tool_calls"]
    assert sorted(calls) == [0]
    for call in calls.values():
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)


def test_json_schema_response_format_validates(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": WEATHER, "strict": True}}
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=fmt, max_tokens=300, seed=3)
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), WEATHER)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=fmt, max_tokens=300,
                                            seed=3, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == reply.choices[0].message.content


def test_the_talker_never_speaks_a_tool_call(client: openai.OpenAI) -> None:
    # several calls (parallel by default): the newlines between them are not spoken either
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "set_lamp"}},
                                           modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"},
                                           max_tokens=200, seed=4)
    assert len(reply.choices[0].message.tool_calls) > 1  # (a random model rarely stops calling: max_tokens ends it)
    assert reply.choices[0].message.audio.transcript == ""
    assert reply.usage.completion_tokens_details.audio_tokens == 0  # the whole reply was a call: nothing to say


def test_a_tool_result_fed_back_gets_a_reply(client: openai.OpenAI) -> None:
    arguments = json.dumps({"city": "Paris", "days": 3})
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    ]
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=8, seed=5)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.choices[0].message.content
    # the prompt holds the call and its result: more tokens than the same turn without them
    bare = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=1, seed=5)
    assert reply.usage.prompt_tokens > bare.usage.prompt_tokens + 20


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    ({"tools": TOOLS + [TOOLS[0]]}, "tools.2.function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "[a-"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
])
def test_bad_tools_and_formats_are_400s_that_name_the_field(client: openai.OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **extra)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param, caught.value.body
