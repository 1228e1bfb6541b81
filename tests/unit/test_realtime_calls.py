"""Function calls in a realtime response and in the conversation, without an engine: the parser's pieces
(in whatever split the stream brings them) -> function_call items and events, and calls -> the next prompt."""

from __future__ import annotations

import json

import pytest

from engine import Message, TextPart, ToolCall
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.calls import ResponseCalls
from voice_gateway.realtime.conversation import Conversation, Item
from voice_gateway.realtime.events import Dialect, FunctionCallItem
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.sender import EventSender

REPLY = ('Sure, here. <tool_call>\n{"name": "set_lamp", "arguments": {"on": true}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>')


def run_calls(pieces: list[str]) -> tuple[list[dict], list[Item], str]:
    outbox = Outbox(1000)
    sender = EventSender(outbox, Dialect.GA)
    items: list[Item] = []
    said: list[str] = []

    def announce(item: Item, shown: FunctionCallItem) -> int:
        items.append(item)
        return len(items)  # the message is output 0

    calls = ResponseCalls("resp_1", sender, announce, said.append)
    for piece in pieces:
        calls.feed(piece)
    calls.close()
    events = []
    while (payload := outbox.get_nowait()) is not None:
        assert isinstance(payload, str)
        events.append(json.loads(payload))
    return events, items, "".join(said)


@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_calls_stream_the_same_in_any_split(size: int) -> None:
    events, items, said = run_calls([REPLY[i : i + size] for i in range(0, len(REPLY), size)])
    assert said.strip() == "Sure, here."
    assert [(i.name, json.loads(i.arguments), i.status) for i in items] == [
        ("set_lamp", {"on": True}, "completed"), ("get_weather", {"city": "Oslo", "days": 2}, "completed")]
    kinds = [(e["type"], e.get("output_index")) for e in events if e["type"] != "response.function_call_arguments.delta"]
    assert kinds == [
        ("response.function_call_arguments.done", 1), ("response.output_item.done", 1), ("conversation.item.done", None),
        ("response.function_call_arguments.done", 2), ("response.output_item.done", 2), ("conversation.item.done", None),
    ]
    for item, index in zip(items, (1, 2), strict=True):
        deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
                  and e["output_index"] == index]
        assert "".join(deltas) == item.arguments
        # every delta comes before its call is done
        last_delta = max(i for i, e in enumerate(events) if e.get("item_id") == item.id and "delta" in e)
        done = next(i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.done"
                    and e["item_id"] == item.id)
        assert last_delta < done


def test_a_call_cut_off_ends_incomplete() -> None:
    events, items, _ = run_calls([REPLY[:60]])
    assert [(i.name, i.status) for i in items] == [("set_lamp", "incomplete")]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["item"]["status"] == "incomplete"


def test_calls_join_the_assistant_turn_before_them() -> None:
    conversation = Conversation(10_000, 16_000, 16)
    conversation.add(Item("u", "user", "lamp and weather?"))
    conversation.add(Item("a", "assistant", "Sure."))
    conversation.add(Item("c1", "assistant", kind="function_call", call_id="x", name="set_lamp", arguments="{}"))
    conversation.add(Item("c2", "assistant", kind="function_call", call_id="y", name="get_weather", arguments="{"),
                     )
    conversation.items[-1].status = "incomplete"  # cut off: the prompt leaves it out
    conversation.add(Item("c3", "assistant", kind="function_call", call_id="z", name="get_weather", arguments="{}"))
    conversation.add(Item("o1", "tool", "on", kind="function_call_output", call_id="x"))
    conversation.add(Item("o3", "tool", "sunny", kind="function_call_output", call_id="z"))
    assert conversation.prompt(ev.SessionConfig(instructions="Be brief.")) == (
        Message("system", (TextPart("Be brief."),)),
        Message("user", (TextPart("lamp and weather?"),)),
        Message("assistant", (TextPart("Sure."),), (ToolCall("set_lamp", "{}"), ToolCall("get_weather", "{}"))),
        Message("tool", (TextPart("on"),)),
        Message("tool", (TextPart("sunny"),)),
    )
