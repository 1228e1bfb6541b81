"""A realtime Session's answers to the conversation and session events agent frameworks send, error paths
included: item create at the root, delete, retrieve, truncate, voices, rejected settings, idle timeout,
out-of-band responses and their own input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, create_engine, load_profile
from tests.session_events import drain, send
from voice_gateway.audio.semantic_vad import SemanticVad
from voice_gateway.audio.vad import ServerVad
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.events import Dialect
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import CANCEL_NOT_ACTIVE, Session

# the engine's stage loops run on the loop its fixture started them on: the tests share that loop
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def engine(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[Engine]:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await engine.start()
    yield engine
    await engine.stop()


def new_session(engine: Engine, dialect: Dialect = Dialect.GA) -> Session:
    session = Session(engine, GatewayConfig(), dialect, GatewayMetrics(), "test")
    session.open()
    drain(session)
    return session



def text_item(item_id: str, text: str, role: str = "user") -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": part, "text": text}]}


async def test_items_at_the_root_delete_and_retrieve(engine: Engine) -> None:
    session = new_session(engine)
    added = await send(session, type="conversation.item.create", item=text_item("b", "second"))
    assert [e["type"] for e in added] == ["conversation.item.added", "conversation.item.done"]
    first = await send(session, type="conversation.item.create", previous_item_id="root",
                       item=text_item("a", "first", "system"))
    assert "previous_item_id" not in first[0]  # first in the conversation
    assert first[0]["item"]["content"] == [{"type": "input_text", "text": "first"}]
    assert [item.id for item in session.conversation.items] == ["a", "b"]
    [retrieved] = await send(session, type="conversation.item.retrieve", item_id="b", event_id="rci_b")
    assert retrieved["type"] == "conversation.item.retrieved"
    assert retrieved["item"]["id"] == "b" and retrieved["item"]["content"][0]["text"] == "second"
    [deleted] = await send(session, type="conversation.item.delete", item_id="a")
    assert deleted == {"type": "conversation.item.deleted", "event_id": deleted["event_id"], "item_id": "a"}
    assert [item.id for item in session.conversation.items] == ["b"]


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "conversation.item.delete", "item_id": "nope"}, "item_delete_invalid_item_id", "item_id"),
        ({"type": "conversation.item.retrieve", "item_id": "nope"}, "item_retrieve_invalid_item_id", "item_id"),
        ({"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 0},
         "item_truncate_invalid_item_id", "item_id"),
        ({"type": "conversation.item.create", "previous_item_id": "nope", "item": text_item("c", "hi")},
         "item_create_invalid_previous_item_id", "previous_item_id"),
        ({"type": "conversation.item.create", "item": text_item("b", "again")}, "item_create_duplicate_item_id",
         "item.id"),
        ({"type": "conversation.item.truncate", "item_id": "b", "content_index": 0, "audio_end_ms": 10},
         "invalid_value", "audio_end_ms"),
        ({"type": "response.cancel"}, "response_cancel_not_active", None),
        ({"type": "response.create", "response": {"voice": "nova"}}, "invalid_value", "response.audio.output.voice"),
    ],
)
async def test_conversation_event_errors(engine: Engine, event: dict[str, Any], code: str, param: str | None) -> None:
    session = new_session(engine)
    await send(session, type="conversation.item.create", item=text_item("b", "there"))
    events = await send(session, **event, event_id="evt_x")
    assert [e["type"] for e in events] == ["error"], events
    error = events[0]["error"]
    assert (error["code"], error.get("param"), error["event_id"]) == (code, param, "evt_x")
    assert session.response is None and [item.id for item in session.conversation.items] == ["b"]
    if code == "response_cancel_not_active":
        assert error["message"] == CANCEL_NOT_ACTIVE  # LiveKit recognises the barge-in race by it


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
async def test_an_unknown_voice_rejects_the_voice_only(engine: Engine, dialect: Dialect) -> None:
    session = new_session(engine, dialect)
    voice = {"audio": {"output": {"voice": "nova"}}} if dialect is Dialect.GA else {"voice": "nova"}
    events = await send(session, type="session.update", event_id="u1", session={**voice, "instructions": "Hi."})
    assert [e["type"] for e in events] == ["error", "session.updated"]
    error = events[0]["error"]
    assert error["param"] == ("session.audio.output.voice" if dialect is Dialect.GA else "session.voice")
    assert "chelsie" in error["message"] and "marin" in error["message"]
    assert session.config.instructions == "Hi." and session.config.voice is None
    mapped = {"audio": {"output": {"voice": "marin"}}} if dialect is Dialect.GA else {"voice": "marin"}
    assert [e["type"] for e in await send(session, type="session.update", session=mapped)] == ["session.updated"]
    assert session.config.voice == "marin"


async def test_rejected_settings_leave_the_rest_applied(engine: Engine) -> None:
    session = new_session(engine)
    events = await send(session, type="session.update", session={
        "instructions": "Be brief.", "output_modalities": [],
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}})
    assert [e["type"] for e in events] == ["error", "session.updated"]
    assert events[0]["error"]["param"] == "session.output_modalities"
    td = events[1]["session"]["audio"]["input"]["turn_detection"]
    assert (td["type"], td["eagerness"]) == ("semantic_vad", "low")
    assert session.config.instructions == "Be brief." and session.config.output_modality == "audio"
    vad = session.turns.vad  # Smart Turn at eagerness low, or the server VAD's 1000 ms where the model is absent
    assert isinstance(vad, SemanticVad) and vad.config.eagerness == "low" or \
        isinstance(vad, ServerVad) and vad.config.silence_duration_ms == 1000


async def test_idle_timeout_asks_for_a_reply(engine: Engine) -> None:
    session = new_session(engine)
    await send(session, type="session.update", session={
        "output_modalities": ["text"], "max_output_tokens": 4,
        "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}})
    await send(session, type="conversation.item.create", item=text_item("u", "hello"))
    await deliver(session, json.dumps({"type": "response.create"}))
    assert session.response is not None and session.response.task is not None
    await asyncio.wait_for(session.response.task, 60)
    assert session.idle.armed  # the idle clock runs from the reply's end
    session.idle.arm(0.01, session._idle_timeout)
    await asyncio.sleep(0.05)
    events = drain(session)
    types = [e["type"] for e in events]
    assert "input_audio_buffer.timeout_triggered" in types and "response.created" in types
    assert session.response is not None and session.response.task is not None
    await asyncio.wait_for(session.response.task, 60)
    await send(session, type="session.update", session={"audio": {"input": {"turn_detection": None}}})
    assert not session.idle.armed
    await session.close()


async def respond(session: Session, **response: Any) -> list[dict[str, Any]]:
    """A response.create and every event up to its response.done."""
    events = await send(session, type="response.create", response={"max_output_tokens": 4, **response})
    if session.response is not None and session.response.task is not None:
        await asyncio.wait_for(session.response.task, 60)
    return events + drain(session)


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
async def test_an_out_of_band_response_stays_out_of_the_conversation(engine: Engine, dialect: Dialect) -> None:
    session = new_session(engine, dialect)
    long_turn = " ".join(["The conversation so far is long and winding."] * 8)
    await send(session, type="conversation.item.create", item=text_item("u", long_turn))
    in_band = await respond(session)
    events = await respond(session, conversation="none", metadata={"topic": "summary"},
                           input=[text_item("oob_in", "Summarise: hello.")])
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.done", types
    assert "response.output_item.added" in types and "response.output_item.done" in types
    assert not [t for t in types if t.startswith("conversation.item.")], types
    audio_delta = "response.output_audio.delta" if dialect is Dialect.GA else "response.audio.delta"
    assert audio_delta in types
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["metadata"] == {"topic": "summary"}
    [out] = done["output"]
    # its own input for a prompt: shorter than the conversation's history
    assert done["usage"]["input_tokens"] < in_band[-1]["response"]["usage"]["input_tokens"]
    in_band_reply = in_band[-1]["response"]["output"][0]["id"]
    assert [item.id for item in session.conversation.items] == ["u", in_band_reply]
    [missing] = await send(session, type="conversation.item.retrieve", item_id=out["id"])
    assert missing["error"]["code"] == "item_retrieve_invalid_item_id"
    later = session.conversation.prompt(ev.SessionConfig())
    assert [m.role for m in later] == ["user", "assistant"]  # the next turn's prompt: neither input nor output
    await session.close()


async def test_an_item_reference_takes_the_conversation_item(engine: Engine) -> None:
    session = new_session(engine)
    await send(session, type="conversation.item.create", item=text_item("u", "Tell me about the sea."))
    in_band = await respond(session)
    events = await respond(session, conversation="none", input=[{"type": "item_reference", "id": "u"}])
    done = events[-1]["response"]
    assert done["status"] == "completed"
    # the same prompt as the first response's, which had only "u" before it
    assert done["usage"]["input_tokens"] == in_band[-1]["response"]["usage"]["input_tokens"]
    # with conversation "auto", input still sets the prompt, and the output joins the conversation
    events = await respond(session, input=[])
    added = [e for e in events if e["type"] == "conversation.item.added"]
    assert [e["item"]["id"] for e in added] == [session.conversation.items[-1].id]
    assert events[-1]["response"]["usage"]["input_tokens"] < done["usage"]["input_tokens"]
    await session.close()


@pytest.mark.parametrize(
    ("response", "code", "param"),
    [
        ({"conversation": "conv_123"}, "invalid_value", "response.conversation"),
        ({"conversation": "none", "input": [text_item("a", "hi"), {"type": "item_reference", "id": "nope"}]},
         "item_not_found", "response.input.1.id"),
        ({"input": [{"type": "message", "role": "robot", "content": []}]}, "invalid_value", "response.input.0.role"),
        ({"input": [{"type": "function_call_output", "output": "4"}]}, "invalid_value", "response.input.0.call_id"),
    ],
)
async def test_a_bad_response_context_refuses_the_response(engine: Engine, response: dict[str, Any], code: str,
                                                           param: str) -> None:
    session = new_session(engine)
    await send(session, type="conversation.item.create", item=text_item("u", "hello"))
    events = await send(session, type="response.create", event_id="evt_r", response=response)
    assert [e["type"] for e in events] == ["error"], events
    error = events[0]["error"]
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt_r")
    assert session.response is None and [item.id for item in session.conversation.items] == ["u"]
    events = await respond(session)
    assert events[-1]["response"]["status"] == "completed"
    await session.close()


async def test_a_response_cancelled_at_once_is_still_created_and_done(engine: Engine) -> None:
    """A client that sends response.create and response.cancel in one breath (one read of the socket, so the
    response's task has not run yet) hears of the response all the same: created, then done, cancelled."""
    session = new_session(engine)
    await send(session, type="conversation.item.create", item=text_item("q", "hello"))
    await deliver(session, json.dumps({"type": "response.create"}))
    assert session.response is not None and session.response.task is not None
    task = session.response.task
    events = await send(session, type="response.cancel")
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 60)
    events += drain(session)
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.done", types
    assert events[-1]["response"]["status"] == "cancelled"
    assert events[-1]["response"]["status_details"]["reason"] == "client_cancelled"


async def _until_done(session: Session, ids: set[str], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every event until each of `ids` has its response.done."""
    async with asyncio.timeout(60):
        while not ids <= {e["response"]["id"] for e in events if e["type"] == "response.done"}:
            await asyncio.sleep(0.01)
            events += drain(session)
    return events


async def test_out_of_band_responses_run_beside_the_current_one(engine: Engine) -> None:
    """Two out-of-band responses (one speaking PCM16, one in text) beside the conversation's own: all three run
    at once, each delta names its response, each ends with its own response.done; cancelling one by id
    leaves the others, and a second in-band response is still refused."""
    session = new_session(engine)
    await send(session, type="conversation.item.create", item=text_item("u", "Tell me about the sea."))
    events = await send(session, type="response.create", response={"max_output_tokens": 40})
    current = session.response
    assert current is not None
    for topic, modalities in (("audio", ["audio"]), ("text", ["text"]), ("cancelled", ["text"])):
        events += await send(session, type="response.create", response={
            "conversation": "none", "metadata": {"topic": topic}, "output_modalities": modalities,
            "max_output_tokens": 400 if topic == "cancelled" else 8, "input": [text_item(f"in_{topic}", "Hello.")]})
    assert session.response is current and len(session.responses.aside) == 3
    refused = await send(session, type="response.create")
    assert [e["error"]["code"] for e in refused if e["type"] == "error"] == ["conversation_already_has_active_response"]
    aside = {r.metadata["topic"]: r.id for r in session.responses.aside.values() if r.metadata}
    events += await send(session, type="response.cancel", response_id=aside["cancelled"])
    events = await _until_done(session, {current.id, *aside.values()}, events)
    done = {e["response"]["id"]: e["response"] for e in events if e["type"] == "response.done"}
    assert done[current.id]["status"] == "completed"
    assert done[aside["audio"]]["status"] == "completed" and done[aside["text"]]["status"] == "completed"
    assert done[aside["cancelled"]]["status"] == "cancelled"
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert {d["response_id"] for d in deltas} == {current.id, aside["audio"]}
    assert {e["response_id"] for e in events if e["type"] == "response.output_text.delta"} <= {aside["text"],
                                                                                               aside["cancelled"]}
    assert [item.id for item in session.conversation.items] == ["u", done[current.id]["output"][0]["id"]]
    assert not session.responses.aside and session.response is None
    await session.close()


async def test_beside_an_opus_reply_an_out_of_band_one_must_answer_in_text(engine: Engine) -> None:
    session = new_session(engine)
    await send(session, type="session.update", session={"audio": {"output": {"format": {"type": "audio/opus"}}}})
    await send(session, type="conversation.item.create", item=text_item("u", "Tell me about the sea."))
    await send(session, type="response.create", response={"max_output_tokens": 40})
    refused = await send(session, type="response.create", response={"conversation": "none", "input": []})
    [error] = [e["error"] for e in refused if e["type"] == "error"]
    assert error["code"] == "conversation_already_has_active_response" and "Opus" in error["message"]
    text = await send(session, type="response.create", response={"conversation": "none", "input": [],
                                                                 "output_modalities": ["text"]})
    assert not [e for e in text if e["type"] == "error"] and len(session.responses.aside) == 1
    await session.close()
    assert not session.responses.aside and session.response is None


async def test_a_response_with_tools_on_an_empty_conversation_is_answered(engine: Engine) -> None:
    """What LiveKit's `generate_reply` sends first: tools, no instructions, nothing said yet."""
    session = new_session(engine)
    tool = {"type": "function", "name": "lookup", "description": "Look it up",
            "parameters": {"type": "object", "properties": {}}}
    await send(session, type="session.update", session={"instructions": "", "tools": [tool],
                                                         "output_modalities": ["text"], "max_output_tokens": 4})
    await deliver(session, json.dumps({"type": "response.create"}))
    assert session.response is not None and session.response.task is not None
    await asyncio.wait_for(session.response.task, 60)
    done = drain(session)[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "completed", done


class _Broken:
    """An engine whose submit fails with an exception no engine should raise: a stand-in for a bug of ours,
    which a real engine gives no way to cause on demand."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def submit(self, request: Any) -> Any:
        raise RuntimeError("a bug")


async def test_a_bug_in_a_response_still_ends_it_with_an_error(engine: Engine) -> None:
    session = Session(_Broken(engine), GatewayConfig(), Dialect.GA, GatewayMetrics(), "test")  # type: ignore[arg-type]
    session.open()
    drain(session)
    await send(session, type="conversation.item.create", item=text_item("q", "hello"))
    await deliver(session, json.dumps({"type": "response.create"}))
    assert session.response is not None and session.response.task is not None
    await asyncio.wait_for(session.response.task, 60)
    done = drain(session)[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "failed", done
    assert done["response"]["status_details"]["error"]["code"] == "internal_error"
    await send(session, type="conversation.item.create", item=text_item("q2", "still there?"))  # the session lives on
