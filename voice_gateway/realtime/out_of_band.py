"""Where a response's prompt comes from and where its output goes: `response.create`'s `input` and `conversation`.

`input` gives the response a prompt of its own (client items and `item_reference`s), none of which joins the
conversation. `conversation: "none"` makes the response out of band: its output is announced as any response's
is, but joins no conversation, no `conversation.item.*` event names it, and later prompts leave it out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine import Message
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.client_items import ClientItemReader
from voice_gateway.realtime.conversation import Conversation, Item, prompt_messages
from voice_gateway.realtime.outbox import Delivery
from voice_gateway.realtime.sender import EventSender

AddItem = Callable[[Item], str | None]  # the runner's `add_item`: puts an output item in the conversation


@dataclass(frozen=True, slots=True)
class ResponseContext:
    """One response's prompt source and output destination; the default is a response in the conversation."""

    input: tuple[Item, ...] | None = None  # None: the conversation's history
    in_conversation: bool = True  # False: out of band

    def messages(self, conversation: Conversation, config: ev.SessionConfig) -> tuple[Message, ...]:
        """`ContextFull` when the conversation outgrew the context and truncation is disabled."""
        if self.input is None:
            return conversation.prompt(config)
        return prompt_messages(list(self.input), config.instructions)

    def output_to(self, conversation: Conversation, sender: EventSender) -> tuple[EventSender, AddItem]:
        """The sender and `add_item` a response's runner gets (see `ResponseRunner`)."""
        if self.in_conversation:
            return sender, conversation.add
        return OutOfBandSender(sender.outbox, sender.dialect), _keep_out


def _keep_out(item: Item) -> str | None:
    return None  # an out-of-band item follows nothing: it is in no conversation


class OutOfBandSender(EventSender):
    """An out-of-band response's way out: every event but those that put its items in the conversation."""

    def event(self, event: ev.ServerEvent, response_id: str | None = None) -> Delivery:
        if isinstance(event, ev.ConversationItemAdded | ev.ConversationItemDone):
            return Delivery.QUEUED  # left out on purpose: not a refusal
        return super().event(event, response_id)


async def response_context(reader: ClientItemReader, conversation: Conversation,
                           overrides: ev.ResponseOverrides | None, event_id: str | None) -> ResponseContext | None:
    """`response.create`'s context, or None where an `input` item cannot be used (the client told why)."""
    if overrides is None:
        return ResponseContext()
    in_conversation = overrides.conversation != "none"
    if overrides.input is None:
        return ResponseContext(None, in_conversation)
    items = []
    for index, src in enumerate(overrides.input):
        where = f"response.input.{index}"
        if isinstance(src, ev.ItemReference):
            item = conversation.get(src.id)
            if item is None:
                reader.reporter.error("item_not_found", f"Item with id '{src.id}' not found in the conversation.",
                                      event_id=event_id, param=f"{where}.id")
                return None
        else:
            item = await reader.read(src, event_id, where)
            if item is None:
                return None
        items.append(item)
    return ResponseContext(tuple(items), in_conversation)
