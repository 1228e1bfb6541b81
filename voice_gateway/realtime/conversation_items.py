"""A session's conversation as the client sees it change: items committed, created, deleted and truncated,
each announced, its audio and images kept within bounds, and user audio transcribed when the session asks for it."""

from __future__ import annotations

import numpy as np

from engine import ImagePart, Message
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.conversation import Conversation, Item, audio_ms
from voice_gateway.realtime.item_shapes import protocol_item
from voice_gateway.realtime.out_of_band import ResponseContext
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.settings import SessionSettings
from voice_gateway.realtime.transcription import Transcriber


class ConversationItems:
    """Owns the session's `conversation` and its `transcriber`; responses add their output items through the `add`
    that `ResponseContext.output_to` hands their runner."""

    def __init__(self, conversation: Conversation, transcriber: Transcriber, settings: SessionSettings,
                 sender: EventSender, reporter: ErrorReporter, max_stored_audio_s: float) -> None:
        self.conversation = conversation
        self.transcriber = transcriber
        self.settings = settings  # read only: the instructions and transcription settings now
        self.sender = sender
        self.reporter = reporter
        self.max_stored_audio_s = max_stored_audio_s

    def get(self, item_id: str) -> Item | None:
        return self.conversation.get(item_id)

    def commit_audio(self, samples: np.ndarray, item_id: str, event_id: str | None = None,
                     frame: np.ndarray | None = None) -> None:
        """The user's audio becomes an item at the conversation's end (`input_audio_buffer.committed`), with what
        their camera showed as the turn ended (`frame`, RGB), when a call sends video."""
        images = () if frame is None else (ImagePart(frame),)
        sizes = () if frame is None else ((frame.shape[0], frame.shape[1]),)
        item = Item(item_id, "user", audio=samples, audio_ms=audio_ms(samples), images=images, image_sizes=sizes)
        previous = self.conversation.add(item)
        self.sender.event(ev.InputAudioCommitted(item_id=item_id, previous_item_id=previous))
        self.announce(item, previous)
        if (transcription := self.settings.config.transcription) is not None:
            self.transcriber.start(item, transcription)  # before bounding may drop the audio
        self.bound_media(item, event_id, None)

    def add(self, item: Item, previous_item_id: str | None, event_id: str | None) -> None:
        """A client's item after `previous_item_id` (KeyError if there is no such item)."""
        previous = self.conversation.add(item, previous_item_id)
        self.announce(item, previous)
        self.bound_media(item, event_id, "item.content")

    def delete(self, item_id: str) -> None:
        """KeyError if there is no such item; its transcription in flight stops too."""
        self.conversation.delete(item_id)
        self.transcriber.cancel(item_id)
        self.sender.event(ev.ConversationItemDeleted(item_id=item_id))

    def truncate(self, event: ev.ConversationItemTruncate) -> None:
        """KeyError if there is no such item, ValueError if it cannot be cut there."""
        self.conversation.truncate(event.item_id, event.audio_end_ms)
        self.sender.event(ev.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                                       audio_end_ms=event.audio_end_ms))

    def prompt(self, context: ResponseContext, config: ev.SessionConfig) -> tuple[Message, ...]:
        """A response's prompt; the audio and images it leaves out go. `ContextFull` as `ResponseContext.messages`."""
        messages = context.messages(self.conversation, config)
        self.conversation.bound_media(config)
        return messages

    def announce(self, item: Item, previous: str | None) -> None:
        message = protocol_item(item)
        self.sender.event(ev.ConversationItemAdded(item=message, previous_item_id=previous))
        self.sender.event(ev.ConversationItemDone(item=message, previous_item_id=previous))

    def bound_media(self, added: Item, event_id: str | None, param: str | None) -> None:
        """Keep the audio and images within their bounds; the client hears of it when its new item's own go."""
        self.conversation.bound_media(self.settings.config)
        if added.images_dropped:
            self.reporter.error(
                "input_image_dropped",
                f"item {added.id} holds {len(added.image_sizes)} images; a session keeps at most "
                f"{self.conversation.max_images}, and only those of the items this model's context holds: the item "
                "stays in the conversation without its images, which replies will not see",
                event_id=event_id, param=param)
        if added.audio_dropped:
            context_s = self.conversation.context_audio_s()
            self.reporter.error(
                "input_audio_too_long",
                f"item {added.id} holds {added.audio_ms / 1000:.1f} s of audio; a session keeps at most "
                f"{self.max_stored_audio_s:.0f} s, and this model's context about {context_s} s: "
                "the item stays in the conversation without its audio, which replies will not hear",
                event_id=event_id, param=param)

    async def close(self) -> None:
        """The session ends: transcriptions stop and the audio and images go now, whoever still holds the session."""
        await self.transcriber.close()
        self.conversation.release_media()
