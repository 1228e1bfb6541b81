"""How a conversation `Item` looks on the wire (the protocol's message, function call and output items)."""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.conversation import Item


def protocol_item(item: Item) -> ev.ConversationItem:
    """A conversation item as the protocol shows it: audio items without their audio, text items with theirs,
    each image as an `input_image` part without its URL (megabytes the client has already)."""
    status = "completed" if item.status == "completed" else item.status
    if item.kind == "function_call":
        return ev.FunctionCallItem(id=item.id, status=status, call_id=item.call_id, name=item.name,
                                   arguments=item.arguments)
    if item.kind == "function_call_output":
        return ev.FunctionCallOutputItem(id=item.id, status=status, call_id=item.call_id, output=item.text)
    images = [ev.ContentPart(type="input_image") for _ in item.image_sizes]
    if item.role == "assistant" and (item.audio_ms > 0 or item.audio is not None):
        parts = [ev.ContentPart(type="output_audio", transcript=item.text)]
    elif item.audio is not None or item.audio_dropped:
        parts = [ev.ContentPart(type="input_audio", transcript=item.transcript or None), *images]
    elif images and not item.text:
        parts = images
    else:
        text = ev.ContentPart(type="output_text" if item.role == "assistant" else "input_text", text=item.text)
        parts = [*images, text]
    assert item.role != "tool", item
    return ev.MessageItem(id=item.id, role=item.role, status=status, content=parts)
