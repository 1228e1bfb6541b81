"""A session's conversation: its items, and how they become the Thinker's prompt.

Once the history outgrows the context budget, a block of the oldest items leaves the prompt at once, down to the
share `truncation` retains, so the prompt starts the same (its cached prefix holds) for many turns after; the
instructions and tools stay, and with truncation `"disabled"` the response fails. An assistant item truncated
after a barge-in keeps the part of its transcript the user heard. Only the items the prompt can still use keep
their audio and images, at most `max_audio_samples` and `max_images`, oldest dropped first. A user item's prompt
holds its audio, then its images, then its text; function calls join the assistant message as chat's do."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ, AudioPart, EngineError, ImagePart, Message, TextPart, ToolCall
from voice_gateway.realtime import events as ev

# Prompt cost estimates, on the generous side: the engine checks the real count.
_TOKENS_PER_AUDIO_SECOND = 13  # Qwen3-Omni's audio encoder: 13 tokens per 100 mel frames (1 s)
_CHARS_PER_TOKEN = 3  # English text and JSON; a digit or a character outside ASCII is a token of its own
_TOKENS_PER_TURN = 6  # <|im_start|>role\n ... <|im_end|>\n
# An image is one token per 32 x 32 pixels (Qwen3-Omni's 2 x 2 merged 16 x 16 patches) once the engine resized
# it to within its budget (`ModelInfo.max_image_pixels`); then <|vision_start|> and <|vision_end|>.
_IMAGE_TOKEN_PIXELS = 32 * 32
DEFAULT_MAX_IMAGE_PIXELS = 400 * _IMAGE_TOKEN_PIXELS  # the engine's default budget: a 1280 x 720 frame
# "auto": a cut keeps half the room, so half of it fills before the next cut. Each cut prefills the history it
# keeps again (its start moved); at three quarters a call re-prefilled three times the tokens a turn, and 32 calls
# x 80 turns on an H100 had 111 turns behind playback against 7 (docs/performance/long-calls.md)
AUTO_RETENTION = 0.5


ROOT = "root"  # previous_item_id for the start of the conversation


def estimated_text_tokens(text: str) -> int:
    """Qwen's tokenizer makes each digit a token, and most characters outside ASCII (Chinese) one or more."""
    dense = sum(1 for c in text if c.isdigit() or not c.isascii())
    return dense + (len(text) - dense) // _CHARS_PER_TOKEN


def estimated_image_tokens(height: int, width: int, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> int:
    return max(-(-min(height * width, max_pixels) // _IMAGE_TOKEN_PIXELS), 4) + 2


def new_item_id() -> str:
    return f"item_{uuid.uuid4().hex[:20]}"


ItemKind = Literal["message", "function_call", "function_call_output"]


@dataclass(slots=True)
class Item:
    id: str
    role: Literal["user", "assistant", "system", "tool"]  # a call is the assistant's, its output the tool's
    text: str = ""  # typed text, the transcript of generated audio, or a call's output
    audio: np.ndarray | None = None  # user speech, float32 at 16 kHz
    audio_ms: int = 0  # how much audio the item holds (user) or was generated (assistant)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    audio_dropped: bool = False  # the conversation let go of `audio`: the prompt gets the text alone
    images: tuple[ImagePart, ...] = ()  # user images, RGB
    image_sizes: tuple[tuple[int, int], ...] = ()  # (height, width) of each image the item holds or held
    images_dropped: bool = False  # the conversation let go of `images`
    kind: ItemKind = "message"
    call_id: str = ""  # function_call, function_call_output
    name: str = ""  # function_call: the function
    arguments: str = ""  # function_call: JSON text, as the model wrote it
    transcript: str = ""  # user audio: its input transcription, when the session asks for one
    in_context: bool = True  # False once truncation took it out of the prompt, for good

    def estimated_tokens(self, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> int:
        # Dropped audio still counts, so trimming stays oldest-first: an item that left the context for
        # its audio does not come back as text while newer items are left out.
        has_audio = self.audio is not None or self.audio_dropped
        audio_tokens = int(self.audio_ms / 1000 * _TOKENS_PER_AUDIO_SECOND) + 3 if has_audio else 0
        image_tokens = sum(estimated_image_tokens(h, w, max_image_pixels) for h, w in self.image_sizes)
        text_tokens = estimated_text_tokens(self.text + self.name + self.arguments) + 1
        return _TOKENS_PER_TURN + text_tokens + audio_tokens + image_tokens

    def drop_audio(self) -> None:
        if self.audio is not None:
            self.audio, self.audio_dropped = None, True

    def drop_images(self) -> None:
        if self.images:
            self.images, self.images_dropped = (), True


class ContextFull(EngineError):
    """The history outgrew the context and the session's truncation is "disabled"."""

    def __init__(self, used: int, room: int) -> None:
        super().__init__(f"the conversation needs about {used} tokens after the instructions and tools, and the "
                         f"context leaves {room}; truncation is disabled, so nothing was dropped: delete items "
                         "(conversation.item.delete) or set truncation to \"auto\"", code="context_length_exceeded")


class Conversation:
    """Owns the items, in order, and which of them keep their audio and images. `cut_early` (0 to 0.5): how much of
    the way from the full room down to the retained share this conversation's first cut comes before the room is
    full. Calls that began together and say alike would reach their room at the same turn, and each cut re-prefills
    most of its prompt: a first cut of its own spreads those re-prefills over several turns, and the cuts after it,
    each a whole room apart, keep the spread (a session draws it)."""

    def __init__(self, budget_tokens: int, max_audio_samples: int, max_images: int,
                 max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, cut_early: float = 0.0) -> None:
        assert 0.0 <= cut_early <= 0.5, cut_early
        self.items: list[Item] = []
        self.budget_tokens = budget_tokens  # what the prompt may take of the context
        self.cut_early = cut_early
        self.cut = False  # whether the history was cut before: only the first comes early
        self.max_audio_samples = max_audio_samples  # 16 kHz samples the items' audio may hold in all
        self.max_images = max_images  # images the items may hold in all
        self.max_image_pixels = max_image_pixels  # the model's budget for one image (ModelInfo.max_image_pixels)

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` (at the end when None, first when "root"); returns the id before it."""
        if previous_item_id is None:
            index = len(self.items)
        elif previous_item_id == ROOT:
            index = 0
        else:
            index = next((i + 1 for i, it in enumerate(self.items) if it.id == previous_item_id), -1)
            if index < 0:
                raise KeyError(previous_item_id)
        self.items.insert(index, item)
        return self.items[index - 1].id if index > 0 else None

    def bound_media(self, config: ev.SessionConfig) -> None:
        """Drop the audio and images of the items the prompt leaves out (or would leave out, unless truncation is
        disabled), then the oldest audio past `max_audio_samples` and the oldest images past `max_images`."""
        start = 0 if config.truncation == "disabled" else self._fitting_start(config)
        audio_room, image_room = self.max_audio_samples, self.max_images
        for index in range(len(self.items) - 1, -1, -1):
            item = self.items[index]
            left_out = index < start or not item.in_context
            # the oldest go first: once one item's cannot be kept, nothing older keeps its own
            if item.audio is not None:
                if left_out or item.audio.size > audio_room:
                    audio_room = 0
                    item.drop_audio()
                else:
                    audio_room -= item.audio.size
            if item.images:
                if left_out or len(item.images) > image_room:
                    image_room = 0
                    item.drop_images()
                else:
                    image_room -= len(item.images)

    def context_audio_s(self) -> int:
        """About how much audio, in seconds, the prompt can hold with nothing else in it."""
        return self.budget_tokens // _TOKENS_PER_AUDIO_SECOND

    def audio_samples(self) -> int:
        return sum(item.audio.size for item in self.items if item.audio is not None)

    def image_count(self) -> int:
        return sum(len(item.images) for item in self.items)

    def release_media(self) -> None:
        for item in self.items:
            item.drop_audio()
            item.drop_images()

    def delete(self, item_id: str) -> Item:
        item = self.get(item_id)
        if item is None:
            raise KeyError(item_id)
        self.items.remove(item)
        return item

    def get(self, item_id: str) -> Item | None:
        return next((it for it in self.items if it.id == item_id), None)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def truncate(self, item_id: str, audio_end_ms: int) -> Item:
        item = self.get(item_id)
        if item is None:
            raise KeyError(item_id)
        if item.role != "assistant" or item.audio_ms <= 0:
            raise ValueError("only an assistant item with audio can be truncated")
        if audio_end_ms > item.audio_ms:
            raise ValueError(f"audio_end_ms {audio_end_ms} is past the item's {item.audio_ms} ms of audio")
        keep = int(len(item.text) * audio_end_ms / item.audio_ms)
        cut = item.text[:keep]
        # end on a word boundary: a half word was not heard as a word
        if keep < len(item.text) and " " in cut:
            cut = cut[: cut.rfind(" ")]
        item.text, item.audio_ms, item.status = cut, audio_end_ms, "incomplete"
        return item

    def room(self, config: ev.SessionConfig) -> int:
        """What the history may take of the context: the budget less the instructions and tools, or less."""
        fixed = _TOKENS_PER_TURN + estimated_text_tokens(config.instructions) if config.instructions else 0
        if config.tools:
            fixed += estimated_text_tokens(json.dumps([t.model_dump(exclude_none=True) for t in config.tools]))
        room = self.budget_tokens - fixed
        limits = config.truncation.token_limits if isinstance(config.truncation, ev.RetentionRatio) else None
        if limits is not None and limits.post_instructions is not None:
            room = min(room, limits.post_instructions)
        return room

    def _fitting_start(self, config: ev.SessionConfig) -> int:
        """The oldest index from which the items fit the room: what the prompt could hold at most."""
        used, room = 0, self.room(config)
        for index in range(len(self.items) - 1, -1, -1):
            used += self.items[index].estimated_tokens(self.max_image_pixels)
            if used > room:
                return index + 1
        return 0

    def fit(self, config: ev.SessionConfig) -> None:
        """Take the oldest items out of the prompt once the rest outgrows the room: a block at once, down to the
        retained share of it (the newest item always stays). `ContextFull` when truncation is disabled."""
        live = [item for item in self.items if item.in_context]
        used, room = sum(item.estimated_tokens(self.max_image_pixels) for item in live), self.room(config)
        if config.truncation == "disabled":
            if used > room:
                raise ContextFull(used, room)
            return
        ratio = config.truncation.retention_ratio if isinstance(config.truncation, ev.RetentionRatio) else AUTO_RETENTION
        keep = ratio * room
        if used <= room - (0.0 if self.cut else self.cut_early) * (room - keep):
            return
        self.cut = True
        for item in live[:-1]:
            # a tool's output goes with the call it answers: no prompt holds an answer to nothing
            if used <= keep and item.kind != "function_call_output":
                break
            item.in_context = False
            used -= item.estimated_tokens(self.max_image_pixels)
        # an async tool's output can come turns after its call, past the items that stay
        gone = {item.call_id for item in live if item.kind == "function_call" and not item.in_context}
        for item in live:
            if item.kind == "function_call_output" and item.call_id in gone:
                item.in_context = False

    def prompt(self, config: ev.SessionConfig) -> tuple[Message, ...]:
        self.fit(config)
        return prompt_messages([item for item in self.items if item.in_context], config.instructions)


def prompt_messages(items: list[Item], instructions: str) -> tuple[Message, ...]:
    """The prompt for `items`, after the instructions: a conversation's history or a response's own `input`."""
    messages = [Message("system", (TextPart(instructions),))] if instructions else []
    for item in items:
        if item.kind == "function_call":
            if item.status == "completed":  # a call cut off has no arguments a prompt can hold
                _add_call(messages, ToolCall(item.name, item.arguments))
            continue
        if item.kind == "function_call_output":
            messages.append(Message("tool", (TextPart(item.text),)))
            continue
        parts: list[TextPart | AudioPart | ImagePart] = []
        if item.audio is not None and item.audio.size:
            parts.append(AudioPart(item.audio))
        parts.extend(item.images)
        if item.text:
            parts.append(TextPart(item.text))
        if parts:
            messages.append(Message(item.role, tuple(parts)))
    return tuple(messages)


def _add_call(messages: list[Message], call: ToolCall) -> None:
    """A call joins the assistant message just before it (its words, or the calls before it), as in chat."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        messages[-1] = Message("assistant", last.content, last.tool_calls + (call,))
    else:
        messages.append(Message("assistant", (), (call,)))


def audio_ms(samples_16k: np.ndarray) -> int:
    return int(samples_16k.size * 1000 / INPUT_SAMPLE_RATE_HZ)
