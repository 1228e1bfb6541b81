"""The conversation item events: `conversation.item.create|delete|retrieve|truncate`, and their errors.

Each handler takes the session as an `ItemHost` (what these handlers need of it) and its event. Error
codes and texts are OpenAI's where clients match on them.
"""

from __future__ import annotations

from typing import Protocol

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.calls import is_json
from voice_gateway.realtime.conversation import Conversation, Item, audio_ms, new_item_id
from voice_gateway.realtime.input_buffer import InputAudioBuffer
from voice_gateway.realtime.item_shapes import protocol_item
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.transcription import Transcriber


class ItemHost(Protocol):
    """What the item handlers read and call of a session (which owns all of it)."""

    config: ev.SessionConfig
    conversation: Conversation
    buffer: InputAudioBuffer
    sender: EventSender
    transcriber: Transcriber

    def error(self, code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> None: ...

    def text_fits(self, text: str | None, what: str, event_id: str | None, param: str) -> bool: ...

    def announce_item(self, item: Item, previous: str | None) -> None: ...

    def bound_audio(self, added: Item, event_id: str | None, param: str | None) -> None: ...


def client_item(host: ItemHost, src: ev.ConversationItem, event_id: str | None, where: str = "item") -> Item | None:
    """A client's item (`conversation.item.create`'s, or one of `response.create`'s `input`) as an `Item`;
    None where it cannot be one, the client told why (`where`: the item's param)."""
    if isinstance(src, ev.MessageItem):
        return _message_item(host, src, event_id, where)
    return _function_item(host, src, event_id, where)


def _function_item(host: ItemHost, src: ev.FunctionCallItem | ev.FunctionCallOutputItem, event_id: str | None,
                   where: str) -> Item | None:
    if isinstance(src, ev.FunctionCallItem):
        if not host.text_fits(src.arguments, "item arguments", event_id, f"{where}.arguments"):
            return None
        arguments = src.arguments or "{}"
        # arguments that are not JSON cannot go into a prompt: the item stays, incomplete, and the prompt skips it
        return Item(src.id or new_item_id(), "assistant", kind="function_call", name=src.name,
                    call_id=src.call_id or f"call_{new_item_id()[5:]}", arguments=arguments,
                    status="completed" if is_json(arguments) else "incomplete")
    if not host.text_fits(src.output, "item output", event_id, f"{where}.output"):
        return None
    return Item(src.id or new_item_id(), "tool", src.output, kind="function_call_output", call_id=src.call_id)


def _message_item(host: ItemHost, src: ev.MessageItem, event_id: str | None, where: str) -> Item | None:
    text = "".join(p.text or p.transcript or "" for p in src.content)
    if not host.text_fits(text, "item text", event_id, f"{where}.content"):
        return None
    audio = [p.audio for p in src.content if p.audio]
    try:
        samples = host.buffer.decode(b"".join(audio), host.config.input_audio_format) if audio else None
    except ValueError as e:
        host.error("invalid_audio", str(e), event_id=event_id, param=f"{where}.content")
        return None
    return Item(src.id or new_item_id(), src.role, text=text, audio=samples,
                audio_ms=audio_ms(samples) if samples is not None else 0)


async def create(host: ItemHost, event: ev.ConversationItemCreate) -> None:
    item = client_item(host, event.item, event.event_id)
    if item is None:
        return
    if host.conversation.get(item.id) is not None:
        # LiveKit takes this code to mean the item is there already, as its create wanted
        host.error("item_create_duplicate_item_id", f"Item with id '{item.id}' already exists.",
                   event_id=event.event_id, param="item.id")
        return
    try:
        previous = host.conversation.add(item, event.previous_item_id)
    except KeyError:
        host.error("item_create_invalid_previous_item_id",
                   f"Error adding item: the previous item with id '{event.previous_item_id}' does not exist.",
                   event_id=event.event_id, param="previous_item_id")
        return
    host.announce_item(item, previous)
    host.bound_audio(item, event.event_id, "item.content")


async def delete(host: ItemHost, event: ev.ConversationItemDelete) -> None:
    try:
        host.conversation.delete(event.item_id)
        host.transcriber.cancel(event.item_id)
    except KeyError:
        host.error("item_delete_invalid_item_id",
                   f"Error deleting item: the item with id '{event.item_id}' does not exist.",
                   event_id=event.event_id, param="item_id")
        return
    host.sender.event(ev.ConversationItemDeleted(item_id=event.item_id))


async def retrieve(host: ItemHost, event: ev.ConversationItemRetrieve) -> None:
    item = host.conversation.get(event.item_id)
    if item is None:
        # Pipecat matches this code to fail the retrieval it waits on (anything else ends its session)
        host.error("item_retrieve_invalid_item_id",
                   f"Error retrieving item: the item with id '{event.item_id}' does not exist.",
                   event_id=event.event_id, param="item_id")
        return
    host.sender.event(ev.ConversationItemRetrieved(item=protocol_item(item)))


async def truncate(host: ItemHost, event: ev.ConversationItemTruncate) -> None:
    try:
        host.conversation.truncate(event.item_id, event.audio_end_ms)
    except KeyError:
        host.error("item_truncate_invalid_item_id",
                   f"Error truncating item: the item with id '{event.item_id}' does not exist.",
                   event_id=event.event_id, param="item_id")
        return
    except ValueError as e:
        host.error("invalid_value", str(e), event_id=event.event_id, param="audio_end_ms")
        return
    host.sender.event(ev.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                           audio_end_ms=event.audio_end_ms))
