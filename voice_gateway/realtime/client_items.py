"""A client's items as conversation `Item`s: `conversation.item.create`'s, and `response.create`'s `input`.

Error codes and texts are OpenAI's where clients match on them.
"""

from __future__ import annotations

from collections.abc import Callable

from engine import ImagePart
from voice_gateway.media.images import IMAGES_NOT_SUPPORTED, TOO_MANY_IMAGES, ImageError, ImageLimits, image_from_url
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.calls import is_json
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.conversation import Item, audio_ms, new_item_id
from voice_gateway.realtime.input_buffer import decode_clip
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.settings import SessionSettings


class ClientItemReader:
    """Reads client items for one session: its input audio format, its limits; owns no state."""

    def __init__(self, settings: SessionSettings, checks: RequestChecks, reporter: ErrorReporter,
                 images: ImageLimits, *, takes_images: bool = True, seen_pixels: int = 0,
                 decoded: Callable[[float], None] | None = None) -> None:
        self.settings = settings
        self.checks = checks
        self.reporter = reporter
        self.images = images
        self.takes_images = takes_images  # the model has eyes (ModelInfo.max_image_pixels)
        self.seen_pixels = seen_pixels  # the most of an image it looks at: large JPEGs decode nearer that
        self.decoded = decoded  # told each picture's decoding time

    async def read(self, src: ev.ConversationItem, event_id: str | None, where: str = "item") -> Item | None:
        """`src` as an `Item`; None where it cannot be one, the client told why (`where`: the item's param).
        Its images are decoded off the event loop, and fetched where their URL is http(s)."""
        if isinstance(src, ev.MessageItem):
            return await self._message_item(src, event_id, where)
        return self._function_item(src, event_id, where)

    def _function_item(self, src: ev.FunctionCallItem | ev.FunctionCallOutputItem, event_id: str | None,
                       where: str) -> Item | None:
        if isinstance(src, ev.FunctionCallItem):
            if not self.checks.text_fits(src.arguments, "item arguments", event_id, f"{where}.arguments"):
                return None
            arguments = src.arguments or "{}"
            # arguments that are not JSON cannot go into a prompt: the item stays, incomplete, and the prompt skips it
            return Item(src.id or new_item_id(), "assistant", kind="function_call", name=src.name,
                        call_id=src.call_id or f"call_{new_item_id()[5:]}", arguments=arguments,
                        status="completed" if is_json(arguments) else "incomplete")
        if not self.checks.text_fits(src.output, "item output", event_id, f"{where}.output"):
            return None
        return Item(src.id or new_item_id(), "tool", src.output, kind="function_call_output", call_id=src.call_id)

    async def _message_item(self, src: ev.MessageItem, event_id: str | None, where: str) -> Item | None:
        text = "".join(p.text or p.transcript or "" for p in src.content)
        if not self.checks.text_fits(text, "item text", event_id, f"{where}.content"):
            return None
        audio = [p.audio for p in src.content if p.audio]
        try:
            fmt = self.settings.config.input_audio_format
            samples = decode_clip(b"".join(audio), fmt) if audio else None
        except ValueError as e:
            self.reporter.error("invalid_audio", str(e), event_id=event_id, param=f"{where}.content")
            return None
        images = await self._images(src, event_id, where)
        if images is None:
            return None
        return Item(src.id or new_item_id(), src.role, text=text, audio=samples,
                    audio_ms=audio_ms(samples) if samples is not None else 0, images=images,
                    image_sizes=tuple((p.pixels.shape[0], p.pixels.shape[1]) for p in images))

    async def _images(self, src: ev.MessageItem, event_id: str | None, where: str) -> tuple[ImagePart, ...] | None:
        """The message's `input_image` parts decoded, in order; None where one cannot be (the client told why).
        Images are the user's alone, and at most `max_images_per_request` of them: checked before any decodes."""
        parts = [(j, p) for j, p in enumerate(src.content) if p.type == "input_image"]
        if parts and not self.takes_images:
            self.reporter.error(IMAGES_NOT_SUPPORTED, f"this model ({self.settings.config.model}) takes no images: "
                                "serve one that does (tiny, or a Qwen3-Omni checkpoint)", event_id=event_id,
                                param=f"{where}.content.{parts[0][0]}")
            return None
        for j, part in parts:
            if src.role != "user":
                self.reporter.error("invalid_value", f"{where}.content.{j}: input_image parts are only for messages "
                                    f"with role 'user', and this message's role is '{src.role}'",
                                    event_id=event_id, param=f"{where}.content.{j}.type")
                return None
            if part.image_url is None:
                self.reporter.error("missing_required_parameter", f"Missing required parameter: "
                                    f"'{where}.content.{j}.image_url'.", event_id=event_id,
                                    param=f"{where}.content.{j}.image_url")
                return None
        if len(parts) > self.images.max_images_per_request:
            self.reporter.error(TOO_MANY_IMAGES, f"the item holds {len(parts)} images; an item may hold at most "
                                f"{self.images.max_images_per_request}", event_id=event_id, param=f"{where}.content")
            return None
        images = []
        for j, part in parts:
            assert part.image_url is not None, j  # checked above
            try:
                images.append(ImagePart(await image_from_url(part.image_url, self.images, self.seen_pixels, self.decoded)))
            except ImageError as e:
                param = f"{where}.content.{j}.image_url"
                self.reporter.error(e.code, f"{param}: {e}", event_id=event_id, param=param)
                return None
        return tuple(images)
