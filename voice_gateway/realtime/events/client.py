"""Client events: one pydantic model each, parsed from a WebSocket or data channel message here only."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    NonNegativeInt,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from voice_gateway.realtime.events.items import INPUT_ITEM_TYPES, ConversationItem
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


# The objects of a session that only group settings: a bad value below one of them rejects the setting it is
# in (`audio.input.turn_detection`, `audio.output.voice`), never its siblings.
_SETTING_GROUPS = {("session",), ("session", "audio"), ("session", "audio", "input"), ("session", "audio", "output")}
# a bound on the retries: each one drops at least one setting, and a session has fewer than this
_MAX_REJECTED_SETTINGS = 32


def _error_path(loc: tuple[int | str, ...]) -> str:
    return printable(".".join(str(part) for part in loc))


def _without(data: dict[str, Any], path: tuple[int | str, ...]) -> dict[str, Any]:
    """A copy of `data` without the value at `path` (whose parents are dicts: they are setting groups)."""
    head, *rest = path
    if not rest:
        return {k: v for k, v in data.items() if k != head}
    return {**data, str(head): _without(data[str(head)], tuple(rest))}


def _rejected_setting(loc: tuple[int | str, ...]) -> tuple[int | str, ...] | None:
    """The setting a validation error at `loc` rejects, or None where the event itself is malformed."""
    for depth in range(1, len(loc)):
        if loc[:depth] in _SETTING_GROUPS and loc[: depth + 1] not in _SETTING_GROUPS:
            return loc[: depth + 1]
    # a group that is not an object (`"audio": 5`) goes whole; the session object itself cannot
    return loc if loc in _SETTING_GROUPS and len(loc) > 1 else None


class SessionUpdate(_ClientEvent):
    """A bad setting rejects that setting only: it is dropped, and `rejected` says why; the rest applies."""

    type: Literal["session.update"] = "session.update"
    session: SessionFields
    _rejected: list[ProtocolError] = PrivateAttr(default_factory=list)

    @property
    def rejected(self) -> list[ProtocolError]:
        return list(self._rejected)

    @model_validator(mode="wrap")
    @classmethod
    def _drop_rejected_settings(cls, data: Any, handler: ModelWrapValidatorHandler[SessionUpdate]) -> SessionUpdate:
        rejected: list[tuple[str, str]] = []  # (param, message)
        for _ in range(_MAX_REJECTED_SETTINGS):
            try:
                event = handler(data)
            except ValidationError as exc:
                errors = exc.errors(include_url=False)
                settings = [_rejected_setting(tuple(e["loc"])) for e in errors]
                if not isinstance(data, dict) or not all(s is not None and _has(data, s) for s in settings):
                    raise
                for error, setting in zip(errors, settings, strict=True):
                    assert setting is not None, errors
                    path = _error_path(tuple(error["loc"]))
                    rejected.append((path, printable(f"{path}: {error['msg']}")))
                    if _has(data, setting):  # two errors in one setting drop it once
                        data = _without(data, setting)
                continue
            event._rejected = [ProtocolError("invalid_value", message, event.event_id, param)
                               for param, message in rejected]
            return event
        raise ValueError("too many rejected settings")


def _has(data: dict[str, Any], path: tuple[int | str, ...]) -> bool:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


class InputAudioAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"] = "input_audio_buffer.append"
    audio: AudioBytes  # in the session's input_audio_format


class InputAudioCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"] = "input_audio_buffer.commit"


class InputAudioClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"] = "input_audio_buffer.clear"


class ConversationItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"] = "conversation.item.create"
    item: ConversationItem
    previous_item_id: CleanText | None = None


class ConversationItemDelete(_ClientEvent):
    type: Literal["conversation.item.delete"] = "conversation.item.delete"
    item_id: CleanText


class ConversationItemRetrieve(_ClientEvent):
    type: Literal["conversation.item.retrieve"] = "conversation.item.retrieve"
    item_id: CleanText


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
    SessionUpdate | InputAudioAppend | InputAudioCommit | InputAudioClear | ConversationItemCreate | ConversationItemDelete | ConversationItemRetrieve | ConversationItemTruncate | ResponseCreate | ResponseCancel | OutputAudioBufferClear,
    Field(discriminator="type"),
]
_CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


def _without_item_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An item's type tag is no field of the event: `item.message.role` is `item.role`."""
    def is_tag(i: int) -> bool:
        after_item = loc[i - 1] == "item" or (isinstance(loc[i - 1], int) and loc[i - 2 : i - 1] == ("input",))
        return loc[i] in INPUT_ITEM_TYPES and after_item

    return tuple(part for i, part in enumerate(loc) if not (i and is_tag(i)))


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
        loc = error["loc"][1:]  # loc[0] is the union tag
        path = ".".join(str(part) for part in _without_item_tags(loc))
        raise ProtocolError("invalid_value", printable(f"{path}: {error['msg']}"), event_id, printable(path)) from None
