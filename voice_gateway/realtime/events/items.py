"""Conversation items as the protocol carries them: messages and their content parts, function calls and
their outputs, and `ConversationItem`, the union of the three (an item without a `type` is a message).
`ResponseInputItem` adds `item_reference`, which `response.create`'s `input` may hold too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, SerializationInfo, Tag, field_serializer, field_validator

from voice_gateway.realtime.events.dialect import BETA_PART_TYPES, GA_PART_TYPES, Dialect, dialect_in
from voice_gateway.realtime.events.wire import AudioBytes, EventModel
from voice_gateway.text import CleanText


class ContentPart(EventModel):
    """One part of a message item; `type` holds the GA name, whichever dialect sent it. An `input_image` comes
    with its `image_url`, and goes back out without it, as audio parts go without their audio."""

    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
    text: CleanText | None = None
    audio: AudioBytes | None = None
    transcript: CleanText | None = None
    image_url: CleanText | None = None  # a data:image/...;base64 URL, or an http(s) URL the server may fetch
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the engine sizes every image by its own budget

    @field_validator("type", mode="before")
    @classmethod
    def _from_beta(cls, value: object) -> object:
        return GA_PART_TYPES.get(value, value) if isinstance(value, str) else value

    @field_serializer("type")
    def _to_dialect(self, value: str, info: SerializationInfo) -> str:
        return BETA_PART_TYPES.get(value, value) if dialect_in(info) is Dialect.BETA else value


class MessageItem(EventModel):
    """A message: what the user said or typed, the instructions, or a reply."""

    id: CleanText | None = None
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    role: Literal["user", "assistant", "system"]
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    content: list[ContentPart] = Field(default_factory=list)


ItemStatus = Literal["completed", "incomplete", "in_progress"]


class FunctionCallItem(EventModel):
    """A call the model made (or, from the client, one it made earlier); `arguments` is JSON text."""

    id: CleanText | None = None
    type: Literal["function_call"] = "function_call"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus | None = None
    call_id: CleanText | None = None  # the client may leave it out; the server names the call then
    name: Annotated[CleanText, Field(min_length=1)]
    arguments: CleanText = ""  # "" while the model is still writing them


class FunctionCallOutputItem(EventModel):
    """A call's result, as the client ran it: fed to the model on the next response."""

    id: CleanText | None = None
    type: Literal["function_call_output"] = "function_call_output"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus | None = None
    call_id: Annotated[CleanText, Field(min_length=1)]
    output: CleanText


class ItemReference(EventModel):
    """A conversation item by its id, in `response.create`'s `input`: the prompt takes that item."""

    type: Literal["item_reference"] = "item_reference"
    id: Annotated[CleanText, Field(min_length=1)]


ITEM_TYPES = ("message", "function_call", "function_call_output")
INPUT_ITEM_TYPES = (*ITEM_TYPES, "item_reference")


def _item_type(value: Any) -> str:
    """The item's union member; any other type is read as a message's, whose error names `item.type`."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ITEM_TYPES else "message"


def _input_item_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in INPUT_ITEM_TYPES else "message"


ConversationItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")] | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]

ResponseInputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")] | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_input_item_type),
]
