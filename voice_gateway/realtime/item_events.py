"""The conversation item events: `conversation.item.create|delete|retrieve|truncate`, and their errors.

Each handler takes the parts it needs: the `ConversationItems` it changes and, to create, the
`ClientItemReader`. Error codes and texts are OpenAI's where clients match on them.
"""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.client_items import ClientItemReader
from voice_gateway.realtime.conversation_items import ConversationItems
from voice_gateway.realtime.item_shapes import protocol_item


async def create(reader: ClientItemReader, items: ConversationItems, event: ev.ConversationItemCreate) -> None:
    item = await reader.read(event.item, event.event_id)
    if item is None:
        return
    if items.get(item.id) is not None:
        # LiveKit takes this code to mean the item is there already, as its create wanted
        items.reporter.error("item_create_duplicate_item_id", f"Item with id '{item.id}' already exists.",
                             event_id=event.event_id, param="item.id")
        return
    try:
        items.add(item, event.previous_item_id, event.event_id)
    except KeyError:
        items.reporter.error(
            "item_create_invalid_previous_item_id",
            f"Error adding item: the previous item with id '{event.previous_item_id}' does not exist.",
            event_id=event.event_id, param="previous_item_id")


async def delete(items: ConversationItems, event: ev.ConversationItemDelete) -> None:
    try:
        items.delete(event.item_id)
    except KeyError:
        items.reporter.error("item_delete_invalid_item_id",
                             f"Error deleting item: the item with id '{event.item_id}' does not exist.",
                             event_id=event.event_id, param="item_id")


async def retrieve(items: ConversationItems, event: ev.ConversationItemRetrieve) -> None:
    item = items.get(event.item_id)
    if item is None:
        # Pipecat matches this code to fail the retrieval it waits on (anything else ends its session)
        items.reporter.error("item_retrieve_invalid_item_id",
                             f"Error retrieving item: the item with id '{event.item_id}' does not exist.",
                             event_id=event.event_id, param="item_id")
        return
    items.sender.event(ev.ConversationItemRetrieved(item=protocol_item(item)))


async def truncate(items: ConversationItems, event: ev.ConversationItemTruncate) -> None:
    try:
        items.truncate(event)
    except KeyError:
        items.reporter.error("item_truncate_invalid_item_id",
                             f"Error truncating item: the item with id '{event.item_id}' does not exist.",
                             event_id=event.event_id, param="item_id")
    except ValueError as e:
        items.reporter.error("invalid_value", str(e), event_id=event.event_id, param="audio_end_ms")
