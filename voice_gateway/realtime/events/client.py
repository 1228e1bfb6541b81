"""Client events: one pydantic model each, parsed from a WebSocket or data channel message here only."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Union

from pydantic import Field, NonNegativeInt, TypeAdapter, ValidationError

from voice_gateway.realtime.events.items import MessageItem
from voice_gateway.realtime.events.session import ResponseOverrides, SessionFields
from voice_gateway.realtime.events.wire import AudioBytes, EventModel
from voice_gateway.text import CleanText, printable


class ProtocolError(Exception):
    """A client event we cannot act on: the session answers with an `error` event and lives on."""

    def __init__(self, code: str, message: str, event_id: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id
        self.param = param


class _ClientEvent(EventModel):
    event_id: CleanText | None = None


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"] = "session.update"
    session: SessionFields


class InputAudioAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"] = "input_audio_buffer.append"
    audio: AudioBytes  # in the session's input_audio_format


class InputAudioCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"] = "input_audio_buffer.commit"


class InputAudioClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"] = "input_audio_buffer.clear"


class ConversationItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"] = "conversation.item.create"
    item: MessageItem
    previous_item_id: CleanText | None = None


class ConversationItemTruncate(_ClientEvent):
    type: Literal["conversation.item.truncate"] = "conversation.item.truncate"
    item_id: CleanText
    content_index: NonNegativeInt
    audio_end_ms: NonNegativeInt  # how much of the item's audio the user heard


class ResponseCreate(_ClientEvent):
    type: Literal["response.create"] = "response.create"
    response: ResponseOverrides | None = None


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"] = "response.cancel"
    response_id: CleanText | None = None


class OutputAudioBufferClear(_ClientEvent):
    """WebRTC only: stop the reply audio that is playing now."""

    type: Literal["output_audio_buffer.clear"] = "output_audio_buffer.clear"


ClientEvent = Annotated[
    Union[
        SessionUpdate,
        InputAudioAppend,
        InputAudioCommit,
        InputAudioClear,
        ConversationItemCreate,
        ConversationItemTruncate,
        ResponseCreate,
        ResponseCancel,
        OutputAudioBufferClear,
    ],
    Field(discriminator="type"),
]
_CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """One WebSocket / data channel message as its event; anything else raises ProtocolError."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError("invalid_json", f"the message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "an event must be a JSON object")
    # echoed in our error event, which must encode: a bad event_id is escaped
    event_id = printable(data["event_id"]) if isinstance(data.get("event_id"), str) else None
    try:
        return _CLIENT_EVENTS.validate_python(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            event_type = data.get("type")
            message = f"unknown event type {event_type!r}" if event_type is not None else "the event has no 'type'"
            raise ProtocolError("unknown_event", message, event_id, "type") from None
        path = ".".join(str(part) for part in error["loc"][1:])  # loc[0] is the union tag
        raise ProtocolError("invalid_value", printable(f"{path}: {error['msg']}"), event_id, printable(path)) from None
