"""The Realtime protocol models against the installed openai SDK: its param types as client
payloads, its server-event unions as the judge of what we emit, and its GA and beta clients
over a loopback WebSocket."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any, cast

import pytest
from openai import AsyncOpenAI
from openai._models import construct_type_unchecked
from openai._utils import maybe_transform
from openai.types import realtime as ga
from openai.types.beta import realtime as beta
from pydantic import BaseModel, TypeAdapter
from websockets.asyncio.server import ServerConnection, serve

from voice_gateway.realtime.events import (
    SEMANTIC_SILENCE_MS,
    AudioFormat,
    ContentPart,
    ContentPartAdded,
    ContentPartDone,
    ConversationItemAdded,
    ConversationItemCreate,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncate,
    ConversationItemTruncated,
    Dialect,
    ErrorDetail,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCleared,
    InputAudioCommit,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    MessageItem,
    OutputAudioDelta,
    OutputAudioDone,
    OutputAudioTranscriptDelta,
    OutputAudioTranscriptDone,
    OutputItemAdded,
    OutputItemDone,
    OutputPart,
    OutputTextDelta,
    OutputTextDone,
    ProtocolError,
    RealtimeResponse,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
    SessionConfig,
    SessionCreated,
    SessionUpdate,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    StatusDetails,
    Transcription,
    TranscriptionTokenDetails,
    TranscriptionUsage,
    TurnDetection,
    Usage,
    apply_response_overrides,
    apply_session_update,
    dialect_for,
    parse_client_event,
    serialize,
    session_payload,
)
from voice_gateway.voices import OPENAI_VOICES, UnknownVoice, resolve_voice

PCM = bytes(range(256)) * 4
PCM_B64 = base64.b64encode(PCM).decode()
SDK_CLIENT_EVENTS = {Dialect.GA: ga.RealtimeClientEventParam, Dialect.BETA: beta.RealtimeClientEventParam}
SDK_SERVER_EVENTS: dict[Dialect, TypeAdapter[Any]] = {
    Dialect.GA: TypeAdapter(ga.RealtimeServerEvent),
    Dialect.BETA: TypeAdapter(beta.RealtimeServerEvent),
}


def wire(payload: Any, dialect: Dialect) -> str:
    """What the SDK client of `dialect` puts on the socket for a param dict (its `send`)."""
    return json.dumps(maybe_transform(payload, SDK_CLIENT_EVENTS[dialect]))


# ------------------------------------------------------------------ client events

GA_SESSION_UPDATE: ga.SessionUpdateEventParam = {
    "type": "session.update",
    "event_id": "evt_session",
    "session": {
        "type": "realtime",
        "output_modalities": ["text"],
        "instructions": "Be brief.",
        "max_output_tokens": 256,
        "audio": {
            "input": {
                "format": {"type": "audio/pcmu"},
                "turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 800},
                "noise_reduction": {"type": "near_field"},
                "transcription": {"model": "whisper-1"},
            },
            "output": {"format": {"type": "audio/pcma"}, "voice": "chelsie", "speed": 1.1},
        },
        "tracing": "auto",
        "tools": [{"type": "function", "name": "set_lamp", "parameters": {"type": "object"}}],
        "tool_choice": "required",
    },
}
BETA_SESSION_UPDATE: beta.SessionUpdateEventParam = {
    "type": "session.update",
    "event_id": "evt_session",
    "session": {
        "modalities": ["text"],
        "instructions": "Be brief.",
        "max_response_output_tokens": 256,
        "input_audio_format": "g711_ulaw",
        "output_audio_format": "g711_alaw",
        "turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 800},
        "voice": "chelsie",
        "input_audio_transcription": {"model": "whisper-1"},
        "tools": [{"type": "function", "name": "set_lamp", "parameters": {"type": "object"}}],
        "tool_choice": "required",
    },
}


@pytest.mark.parametrize(
    ("dialect", "payload"), [(Dialect.GA, GA_SESSION_UPDATE), (Dialect.BETA, BETA_SESSION_UPDATE)], ids=["ga", "beta"]
)
def test_session_update_means_the_same_in_both_dialects(dialect: Dialect, payload: Any) -> None:
    event = parse_client_event(wire(payload, dialect))
    assert isinstance(event, SessionUpdate) and event.event_id == "evt_session"
    before = SessionConfig(temperature=0.6)
    after = apply_session_update(before, event)
    assert after == SessionConfig(
        id=before.id,
        output_modality="text",
        instructions="Be brief.",
        voice="chelsie",
        input_audio_format=AudioFormat.G711_ULAW,
        output_audio_format=AudioFormat.G711_ALAW,
        turn_detection=TurnDetection(threshold=0.7, silence_duration_ms=800),
        max_output_tokens=256,
        temperature=0.6,
        tools=(FunctionTool(name="set_lamp", parameters={"type": "object"}),),
        tool_choice="required",
        transcription=Transcription(model="whisper-1"),
    )


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_audio_buffer_events(dialect: Dialect) -> None:
    append: ga.InputAudioBufferAppendEventParam = {
        "type": "input_audio_buffer.append",
        "audio": PCM_B64,
        "event_id": "a",
    }
    event = parse_client_event(wire(append, dialect).encode())
    assert isinstance(event, InputAudioAppend) and event.audio == PCM and event.event_id == "a"
    assert isinstance(parse_client_event(wire({"type": "input_audio_buffer.commit"}, dialect)), InputAudioCommit)
    assert isinstance(parse_client_event(wire({"type": "input_audio_buffer.clear"}, dialect)), InputAudioClear)


GA_ITEMS: list[ga.ConversationItemParam] = [
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hello"}, {"type": "input_audio", "audio": PCM_B64}],
    },
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
    {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "be kind"}]},
]
BETA_ITEMS: list[beta.ConversationItemParam] = [
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hello"}, {"type": "input_audio", "audio": PCM_B64}],
    },
    {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}]},
    {"role": "system", "content": [{"type": "input_text", "text": "be kind"}]},  # beta's `type` is optional
]


@pytest.mark.parametrize(("dialect", "items"), [(Dialect.GA, GA_ITEMS), (Dialect.BETA, BETA_ITEMS)], ids=["ga", "beta"])
def test_conversation_item_create_normalises_content_types(dialect: Dialect, items: list[Any]) -> None:
    user, assistant, system = (
        parse_client_event(wire({"type": "conversation.item.create", "item": item, "previous_item_id": "p"}, dialect))
        for item in items
    )
    assert isinstance(user, ConversationItemCreate) and user.previous_item_id == "p"
    assert user.item.content == [
        ContentPart(type="input_text", text="hello"),
        ContentPart(type="input_audio", audio=PCM),
    ]
    assert isinstance(assistant, ConversationItemCreate)
    assert assistant.item.content == [ContentPart(type="output_text", text="hi")]
    assert isinstance(system, ConversationItemCreate) and system.item.role == "system"


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_truncate_and_cancel(dialect: Dialect) -> None:
    truncate = {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 1500}
    event = parse_client_event(wire(truncate, dialect))
    assert isinstance(event, ConversationItemTruncate)
    assert (event.item_id, event.content_index, event.audio_end_ms) == ("item_1", 0, 1500)
    cancel = parse_client_event(wire({"type": "response.cancel", "response_id": "resp_1"}, dialect))
    assert isinstance(cancel, ResponseCancel) and cancel.response_id == "resp_1"


GA_RESPONSE_CREATE: ga.ResponseCreateEventParam = {
    "type": "response.create",
    "response": {
        "output_modalities": ["audio"],
        "instructions": "Answer in French.",
        "max_output_tokens": "inf",
        "audio": {"output": {"voice": "aiden", "format": {"type": "audio/pcm", "rate": 24000}}},
    },
}
BETA_RESPONSE_CREATE: beta.ResponseCreateEventParam = {
    "type": "response.create",
    "response": {
        "modalities": ["text", "audio"],
        "instructions": "Answer in French.",
        "max_response_output_tokens": "inf",
        "voice": "aiden",
        "output_audio_format": "pcm16",
        "temperature": 0.9,
    },
}


@pytest.mark.parametrize(
    ("dialect", "payload"), [(Dialect.GA, GA_RESPONSE_CREATE), (Dialect.BETA, BETA_RESPONSE_CREATE)], ids=["ga", "beta"]
)
def test_response_create_overrides_apply_to_that_response_only(dialect: Dialect, payload: Any) -> None:
    session = SessionConfig(output_modality="text", output_audio_format=AudioFormat.G711_ULAW, max_output_tokens=50)
    event = parse_client_event(wire(payload, dialect))
    assert isinstance(event, ResponseCreate)
    for_response = apply_response_overrides(session, event)
    assert for_response.output_modality == "audio"
    assert for_response.voice == "aiden"
    assert for_response.instructions == "Answer in French."
    assert for_response.output_audio_format is AudioFormat.PCM16
    assert for_response.max_output_tokens == "inf"
    assert for_response.temperature == (0.9 if dialect is Dialect.BETA else session.temperature)
    assert session.output_modality == "text"
    plain = parse_client_event('{"type": "response.create"}')
    assert isinstance(plain, ResponseCreate) and apply_response_overrides(session, plain) is session


# ------------------------------------------------------------------ protocol errors


TRUNCATE = {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0}


def session_update(session: dict[str, Any]) -> dict[str, Any]:
    return {"type": "session.update", "session": session}


def user_item(**fields: Any) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", **fields}}


@pytest.mark.parametrize(
    ("raw", "code", "param", "event_id", "in_message"),
    [
        (b"\xff\xfe", "invalid_json", None, None, "JSON"),
        ("{not json", "invalid_json", None, None, "JSON"),
        ("[1, 2]", "invalid_json", None, None, "object"),
        ({"event_id": "e1"}, "unknown_event", "type", "e1", "type"),
        ({"type": "response.explode", "event_id": "e2"}, "unknown_event", "type", "e2", "response.explode"),
        ({"type": 7}, "unknown_event", "type", None, "7"),
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_value", "audio", None, "base64"),
        ({"type": "input_audio_buffer.append", "audio": 12}, "invalid_value", "audio", None, "base64"),
        ({"type": "input_audio_buffer.append"}, "invalid_value", "audio", None, "required"),
        ({**TRUNCATE, "audio_end_ms": "soon", "event_id": "e3"}, "invalid_value", "audio_end_ms", "e3", "integer"),
        ({**TRUNCATE, "audio_end_ms": 5, "event_id": 5}, "invalid_value", "event_id", None, "string"),
        (user_item(content=[{"type": "input_file"}]), "invalid_value", "item.content.0.type", None, "input_image"),
        (user_item(type="mcp_call"), "invalid_value", "item.type", None, "message"),
        (user_item(type="function_call_output"), "invalid_value", "item.call_id", None, "required"),
        ({"type": "conversation.item.create", "item": {"type": "function_call", "arguments": "{}"}}, "invalid_value",
         "item.name", None, "required"),
        (session_update("not an object"), "invalid_value", "session", None, "dictionary"),
        ({"type": "session.update"}, "invalid_value", "session", None, "required"),
        ({"type": "conversation.item.delete", "event_id": "e4"}, "invalid_value", "item_id", "e4", "required"),
        ({"type": "conversation.item.retrieve", "item_id": 5}, "invalid_value", "item_id", None, "string"),
        (
            {"type": "response.create", "response": {"metadata": {"k": "v" * 513}}},
            "invalid_value",
            "response.metadata.k",
            None,
            "512",
        ),
        (
            {"type": "response.create", "response": {"max_output_tokens": 0}},
            "invalid_value",
            "response.max_output_tokens",
            None,
            "positive",
        ),
    ],
)
def test_protocol_errors(
    raw: str | bytes | dict[str, Any], code: str, param: str | None, event_id: str | None, in_message: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_event(json.dumps(raw) if isinstance(raw, dict) else raw)
    error = caught.value
    assert (error.code, error.param, error.event_id) == (code, param, event_id)
    assert in_message in error.message
    payload = json.loads(serialize(ErrorEvent.from_protocol_error(error), Dialect.GA) or "")
    assert payload["error"] == {
        "type": "invalid_request_error",
        "code": code,
        "message": error.message,
        **({"param": param} if param else {}),
        **({"event_id": event_id} if event_id else {}),
    }


@pytest.mark.parametrize(
    ("session", "param", "in_message"),
    [
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "session.audio.input.format.rate",
         "24000"),
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "session.audio.input.format.type", "audio/pcm"),
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
         "session.audio.input.turn_detection.eagerness", "low"),
        ({"turn_detection": {"type": "model_vad"}}, "session.turn_detection.type", "semantic_vad"),
        ({"audio": {"input": {"turn_detection": {"idle_timeout_ms": 10}}}},
         "session.audio.input.turn_detection.idle_timeout_ms", "5000"),
        ({"type": "transcription"}, "session.type", "realtime"),
        ({"output_audio_format": "mp3"}, "session.output_audio_format", "opus"),
        ({"modalities": []}, "session.modalities", "1 item"),
        ({"audio": "loud"}, "session.audio", "dictionary"),
    ],
)
def test_a_bad_setting_rejects_that_setting_only(session: dict[str, Any], param: str, in_message: str) -> None:
    """Pipecat ends its session on any error, LiveKit logs one: the settings around a bad one still apply."""
    event = parse_client_event(json.dumps(session_update({**session, "instructions": "be brief"}) | {"event_id": "e"}))
    assert isinstance(event, SessionUpdate)
    [error] = event.rejected
    assert (error.code, error.param, error.event_id) == ("invalid_value", param, "e")
    assert in_message in error.message
    assert apply_session_update(SessionConfig(), event).instructions == "be brief"


def test_two_bad_settings_are_two_errors_and_the_rest_applies() -> None:
    event = update({"modalities": [], "audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}},
                                                "output": {"voice": "marin", "format": {"type": "audio/pcmu"}}}})
    assert sorted(e.param or "" for e in event.rejected) == ["session.audio.input.format.rate", "session.modalities"]
    config = apply_session_update(SessionConfig(), event)
    assert (config.voice, config.output_audio_format, config.input_audio_format) == (
        "marin", AudioFormat.G711_ULAW, AudioFormat.PCM16)


def test_what_agent_frameworks_send_is_accepted() -> None:
    """LiveKit's and Pipecat's session settings: the ones we ignore (tools, transcription, noise reduction,
    speed, tracing, truncation) are taken without a word; semantic_vad runs on the server VAD."""
    event = update({
        "type": "realtime", "model": "gpt-realtime", "output_modalities": ["audio"], "max_output_tokens": "inf",
        "tool_choice": "auto", "tools": [{"type": "function", "name": "lamp", "parameters": {}}], "tracing": "auto",
        "truncation": "auto",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": {"type": "near_field"},
                      "transcription": {"model": "gpt-4o-transcribe"},
                      "turn_detection": {"type": "semantic_vad", "eagerness": "high", "create_response": True,
                                         "interrupt_response": True}},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.0},
        },
    })
    assert event.rejected == []
    config = apply_session_update(SessionConfig(), event)
    td = config.turn_detection
    assert td is not None and (td.type, td.eagerness) == ("semantic_vad", "high")
    assert td.end_of_turn_silence_ms() == SEMANTIC_SILENCE_MS["high"]
    assert session_payload(config, Dialect.GA)["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "high", "create_response": True, "interrupt_response": True}
    back = apply_session_update(config, update({"turn_detection": {"type": "server_vad", "idle_timeout_ms": 6000}}))
    assert back.turn_detection is not None and back.turn_detection.type == "server_vad"
    assert back.turn_detection.end_of_turn_silence_ms() == 500 and back.turn_detection.idle_timeout_ms == 6000


def test_voice_names_map_onto_the_speakers() -> None:
    speakers = ("aiden", "chelsie", "ethan")
    assert resolve_voice("Ethan", speakers) == "ethan"
    assert {resolve_voice(name, speakers) for name in OPENAI_VOICES} <= set(speakers)
    assert resolve_voice("marin", speakers) == "chelsie"
    with pytest.raises(UnknownVoice, match="aiden, chelsie, ethan.*alloy, ash"):
        resolve_voice("nova", speakers)
    with pytest.raises(UnknownVoice, match="no talker"):
        resolve_voice("marin", ())


# ------------------------------------------------------------------ session.update merging


def update(session: dict[str, Any]) -> SessionUpdate:
    event = parse_client_event(json.dumps({"type": "session.update", "session": session}))
    assert isinstance(event, SessionUpdate)
    return event


def test_update_touches_only_the_fields_it_names() -> None:
    current = SessionConfig(instructions="Be kind.", voice="ethan", temperature=0.7, model="qwen3-omni")
    after = apply_session_update(current, update({"type": "realtime", "audio": {"output": {"voice": "aiden"}}}))
    assert after == current.model_copy(update={"voice": "aiden"})
    assert apply_session_update(current, update({})) == current
    # null for a plain field is treated as absent, not as a reset
    assert apply_session_update(current, update({"instructions": None, "voice": None})) == current


@pytest.mark.parametrize(
    "shape",
    [lambda td: {"audio": {"input": {"turn_detection": td}}}, lambda td: {"turn_detection": td}],
    ids=["ga", "beta"],
)
def test_turn_detection_null_partial_and_from_manual(shape: Callable[[Any], dict[str, Any]]) -> None:
    vad = SessionConfig()
    manual = apply_session_update(vad, update(shape(None)))
    assert manual.turn_detection is None
    partial = apply_session_update(vad, update(shape({"type": "server_vad", "create_response": False})))
    assert partial.turn_detection == TurnDetection(create_response=False)
    tuned = apply_session_update(partial, update(shape({"prefix_padding_ms": 100})))
    assert tuned.turn_detection == TurnDetection(create_response=False, prefix_padding_ms=100)
    back_on = apply_session_update(manual, update(shape({"threshold": 0.3})))
    assert back_on.turn_detection == TurnDetection(threshold=0.3)
    # a GA update that leaves turn_detection out keeps it
    assert apply_session_update(tuned, update({"audio": {"input": {"format": {"type": "audio/pcm"}}}})) == tuned


def test_modalities_normalise_to_one_output_modality() -> None:
    text = SessionConfig(output_modality="text")
    assert apply_session_update(text, update({"modalities": ["text", "audio"]})).output_modality == "audio"
    assert apply_session_update(text, update({"output_modalities": ["audio"]})).output_modality == "audio"
    assert apply_session_update(SessionConfig(), update({"modalities": ["text"]})).output_modality == "text"


def test_dialect_from_the_openai_beta_header() -> None:
    assert dialect_for(None) is Dialect.GA
    assert dialect_for("assistants=v2") is Dialect.GA
    assert dialect_for("realtime=v1") is Dialect.BETA
    assert dialect_for("assistants=v2, realtime=v1") is Dialect.BETA


# ------------------------------------------------------------------ server events against the SDK


def sample_server_events() -> list[ServerEvent]:
    config = SessionConfig(model="qwen3-omni", voice="ethan", instructions="Be brief.", max_output_tokens=512)
    user = MessageItem(
        id="item_user",
        role="user",
        status="completed",
        content=[ContentPart(type="input_audio", transcript=None), ContentPart(type="input_text", text="and?")],
    )
    spoken = MessageItem(
        id="item_reply",
        role="assistant",
        status="completed",
        content=[ContentPart(type="output_audio", transcript="Hello there.")],
    )
    written = MessageItem(id="item_text", role="assistant", content=[ContentPart(type="output_text", text="Hi.")])
    call = FunctionCallItem(id="item_call", status="completed", call_id="call_1", name="set_lamp",
                            arguments='{"on": true}')
    ref: dict[str, Any] = {"response_id": "resp_1", "item_id": "item_reply", "output_index": 0, "content_index": 0}
    usage = Usage(total_tokens=30, input_tokens=20, output_tokens=10)
    return [
        SessionCreated(session=config),
        SessionUpdated(session=config.model_copy(update={"turn_detection": None, "output_modality": "text"})),
        SpeechStarted(audio_start_ms=120, item_id="item_user"),
        SpeechStopped(audio_end_ms=1800, item_id="item_user"),
        InputAudioCommitted(item_id="item_user", previous_item_id="item_0"),
        InputAudioCommitted(item_id="item_first"),
        InputAudioCleared(),
        ConversationItemAdded(item=user, previous_item_id="item_0"),
        ConversationItemDone(item=user),
        ConversationItemTruncated(item_id="item_reply", content_index=0, audio_end_ms=900),
        ConversationItemDeleted(item_id="item_reply"),
        ConversationItemRetrieved(item=spoken),
        InputAudioTimeoutTriggered(audio_start_ms=3000, audio_end_ms=9000, item_id="item_idle"),
        ResponseCreated(response=RealtimeResponse(id="resp_2", metadata={"client_event_id": "response_create_1"})),
        SessionUpdated(session=config.model_copy(update={"turn_detection": TurnDetection(
            type="semantic_vad", eagerness="low")})),
        SessionUpdated(session=config.model_copy(update={"turn_detection": TurnDetection(idle_timeout_ms=6000)})),
        ResponseCreated(response=RealtimeResponse(id="resp_1")),
        OutputItemAdded(response_id="resp_1", item=spoken.model_copy(update={"status": "in_progress"})),
        ContentPartAdded(**ref, part=OutputPart(type="audio", transcript="")),
        OutputAudioDelta(**ref, delta=PCM),
        OutputAudioTranscriptDelta(**ref, delta="Hello "),
        OutputAudioDone(**ref),
        OutputAudioTranscriptDone(**ref, transcript="Hello there."),
        ContentPartDone(**ref, part=OutputPart(type="audio", transcript="Hello there.")),
        OutputItemDone(response_id="resp_1", item=spoken),
        OutputTextDelta(**ref, delta="Hi"),
        OutputTextDone(**ref, text="Hi."),
        ResponseDone(response=RealtimeResponse(id="resp_1", status="completed", output=[spoken], usage=usage)),
        ResponseDone(
            response=RealtimeResponse(
                id="resp_2",
                status="cancelled",
                status_details=StatusDetails(type="cancelled", reason="turn_detected"),
                output=[written],
                usage=usage,
            )
        ),
        ResponseDone(
            response=RealtimeResponse(
                id="resp_3",
                status="failed",
                status_details=StatusDetails(
                    type="failed", error=ErrorEvent.from_protocol_error(ProtocolError("engine", "boom")).error
                ),
            )
        ),
        ErrorEvent.from_protocol_error(ProtocolError("unknown_event", "unknown event type 'x'", "evt_9", "type")),
        # function calling
        SessionUpdated(session=config.model_copy(update={
            "tools": (FunctionTool(name="set_lamp", description="Switch the lamp", parameters={"type": "object"}),),
            "tool_choice": "required", "transcription": Transcription(model="whisper-1", language="en")})),
        OutputItemAdded(response_id="resp_4", output_index=1, item=FunctionCallItem(
            id="item_call", status="in_progress", call_id="call_1", name="set_lamp")),
        ConversationItemAdded(item=FunctionCallItem(id="item_call", status="in_progress", call_id="call_1",
                                                    name="set_lamp"), previous_item_id="item_reply"),
        FunctionCallArgumentsDelta(response_id="resp_4", item_id="item_call", output_index=1, call_id="call_1",
                                   delta='{"on": '),
        FunctionCallArgumentsDone(response_id="resp_4", item_id="item_call", output_index=1, call_id="call_1",
                                  name="set_lamp", arguments='{"on": true}'),
        OutputItemDone(response_id="resp_4", output_index=1, item=call),
        ConversationItemRetrieved(item=FunctionCallOutputItem(id="item_out", status="completed", call_id="call_1",
                                                              output="done")),
        ResponseDone(response=RealtimeResponse(id="resp_4", status="completed", output=[spoken, call], usage=usage)),
        # input transcription
        InputTranscriptionDelta(item_id="item_user", delta="Hello"),
        InputTranscriptionCompleted(item_id="item_user", transcript="Hello there", usage=TranscriptionUsage(
            total_tokens=30, input_tokens=25, output_tokens=5,
            input_token_details=TranscriptionTokenDetails(text_tokens=12, audio_tokens=13))),
        InputTranscriptionFailed(item_id="item_user", error=ErrorDetail(type="server_error", code="server_overloaded",
                                                                       message="busy")),
    ]


BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}


def unknown_fields(model: Any, path: str = "") -> set[str]:
    """Fields the SDK type does not declare: its models allow extras, so typos would pass silently."""
    if isinstance(model, list):
        return {f for i, m in enumerate(model) for f in unknown_fields(m, f"{path}{i}.")}
    if not isinstance(model, BaseModel):
        return set()
    found = {path + name for name in model.model_extra or {}}
    for name in type(model).model_fields:
        found |= unknown_fields(getattr(model, name), f"{path}{name}.")
    return found


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_every_server_event_validates_with_the_sdk(dialect: Dialect) -> None:
    seen_ids: set[str] = set()
    for event in sample_server_events():
        text = serialize(event, dialect)
        if isinstance(event, (ConversationItemDone, InputAudioTimeoutTriggered)) and dialect is Dialect.BETA:
            assert text is None
            continue
        assert text is not None
        payload = json.loads(text)
        expected_type = BETA_NAMES.get(event.type, event.type) if dialect is Dialect.BETA else event.type
        assert payload["type"] == expected_type
        parsed = SDK_SERVER_EVENTS[dialect].validate_python(payload)
        assert parsed.type == expected_type
        extras = unknown_fields(parsed)
        if isinstance(event, (SessionCreated, SessionUpdated)):
            # the real API sends these although the SDK's session types leave them out
            assert extras == ({"session.id", "session.object"} if dialect is Dialect.GA else {"session.object"})
        else:
            assert extras == set(), (event.type, extras)
        assert payload["event_id"] not in seen_ids
        seen_ids.add(payload["event_id"])


def test_content_types_follow_the_dialect() -> None:
    item = MessageItem(id="i", role="assistant", content=[ContentPart(type="output_audio", transcript="hey")])
    for dialect, part_type in [(Dialect.GA, "output_audio"), (Dialect.BETA, "audio")]:
        payload = json.loads(serialize(OutputItemDone(response_id="r", item=item), dialect) or "")
        assert payload["item"]["content"] == [{"type": part_type, "transcript": "hey"}]
    delta = json.loads(serialize(OutputAudioDelta(response_id="r", item_id="i", delta=PCM), Dialect.BETA) or "")
    assert base64.b64decode(delta["delta"]) == PCM


@pytest.mark.parametrize(
    ("dialect", "sdk_event"),
    [(Dialect.GA, ga.SessionCreatedEvent), (Dialect.BETA, beta.SessionCreatedEvent)],
    ids=["ga", "beta"],
)
def test_session_payload_validates_as_the_sdk_session(dialect: Dialect, sdk_event: type[BaseModel]) -> None:
    config = SessionConfig(voice="ethan", output_audio_format=AudioFormat.G711_ULAW, turn_detection=None)
    event = sdk_event.model_validate(
        {"type": "session.created", "event_id": "e", "session": session_payload(config, dialect)}
    )
    session: Any = event.session  # type: ignore[attr-defined]
    if dialect is Dialect.GA:
        assert session.output_modalities == ["audio"]
        assert session.audio.input.format.type == "audio/pcm" and session.audio.input.format.rate == 24000
        assert session.audio.input.turn_detection is None
        assert session.audio.output.format.type == "audio/pcmu" and session.audio.output.voice == "ethan"
    else:
        assert session.modalities == ["text", "audio"]
        assert (session.input_audio_format, session.output_audio_format) == ("pcm16", "g711_ulaw")
        assert session.turn_detection is None and session.voice == "ethan"


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_session_payload_round_trips_through_session_update(dialect: Dialect) -> None:
    config = SessionConfig(
        output_modality="text",
        voice="aiden",
        input_audio_format=AudioFormat.G711_ALAW,
        turn_detection=TurnDetection(threshold=0.2, interrupt_response=False),
        max_output_tokens=99,
    )
    echoed = apply_session_update(SessionConfig(), update(session_payload(config, dialect)))
    # beta carries temperature, GA does not; GA carries model, beta does not
    assert echoed.model_dump(exclude={"id", "temperature", "model"}) == config.model_dump(
        exclude={"id", "temperature", "model"}
    )


# ------------------------------------------------------------------ Opus extension


@pytest.mark.parametrize(
    ("dialect", "session", "echoed"),
    [
        (Dialect.GA, {"audio": {"output": {"format": {"type": "audio/opus"}}}}, {"type": "audio/opus"}),
        (Dialect.BETA, {"output_audio_format": "opus"}, "opus"),
    ],
    ids=["ga", "beta"],
)
def test_opus_output_round_trips(dialect: Dialect, session: dict[str, Any], echoed: Any) -> None:
    config = apply_session_update(SessionConfig(), update(session))
    assert config.output_audio_format is AudioFormat.OPUS
    assert config.input_audio_format is AudioFormat.PCM16
    text = serialize(SessionUpdated(session=config), dialect)
    assert text is not None
    payload = json.loads(text)["session"]
    if dialect is Dialect.GA:
        assert payload["audio"]["output"]["format"] == echoed
    else:
        assert payload["output_audio_format"] == echoed
    fresh = SessionConfig()
    assert apply_session_update(fresh, update(payload)) == config.model_copy(update={"id": fresh.id})
    # Opus is outside the SDK's format enums, so only the client's lenient parse (what
    # connection.recv() uses) reads it; it must still hand the value through untouched.
    union = ga.RealtimeServerEvent if dialect is Dialect.GA else beta.RealtimeServerEvent
    received: Any = construct_type_unchecked(value=json.loads(text), type_=union)  # type: ignore[arg-type]
    if dialect is Dialect.GA:
        assert received.session.audio.output.format.type == "audio/opus"
    else:
        assert received.session.output_audio_format == "opus"


# ------------------------------------------------------------------ the SDK clients themselves


async def answer(ws: ServerConnection) -> None:
    """A minimal Realtime endpoint: session.created, then session.updated or error per message."""
    dialect = dialect_for(ws.request.headers.get("OpenAI-Beta") if ws.request else None)
    config = SessionConfig(model="qwen3-omni")
    await ws.send(serialize(SessionCreated(session=config), dialect) or "")
    async for message in ws:
        try:
            event = parse_client_event(message)
        except ProtocolError as exc:
            await ws.send(serialize(ErrorEvent.from_protocol_error(exc), dialect) or "")
            continue
        if isinstance(event, SessionUpdate):
            config = apply_session_update(config, event)
            await ws.send(serialize(SessionUpdated(session=config), dialect) or "")


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
async def test_official_clients_talk_to_it(dialect: Dialect) -> None:
    async with serve(answer, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        client = AsyncOpenAI(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{port}/v1")
        realtime: Any = client.realtime if dialect is Dialect.GA else client.beta.realtime
        async with realtime.connect(model="qwen3-omni") as connection:
            created: Any = await asyncio.wait_for(connection.recv(), 5)
            assert created.type == "session.created"
            if dialect is Dialect.GA:
                assert isinstance(created, ga.SessionCreatedEvent)
                await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            else:
                assert isinstance(created, beta.SessionCreatedEvent)
                await connection.session.update(session={"modalities": ["text"]})
            updated: Any = await asyncio.wait_for(connection.recv(), 5)
            assert updated.type == "session.updated"
            modalities = updated.session.output_modalities if dialect is Dialect.GA else updated.session.modalities
            assert modalities == ["text"]
            await connection.send(cast(Any, {**TRUNCATE, "audio_end_ms": -1}))
            error: Any = await asyncio.wait_for(connection.recv(), 5)
            assert error.type == "error" and error.error.param == "audio_end_ms"


def test_on_a_model_of_one_voice_every_openai_name_is_that_voice() -> None:
    assert {resolve_voice(name, ("joe",)) for name in OPENAI_VOICES} == {"joe"}
    with pytest.raises(UnknownVoice, match="joe.*alloy"):
        resolve_voice("nova", ("joe",))
