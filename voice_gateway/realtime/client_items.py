"""A client's items as conversation `Item`s: `conversation.item.create`'s, and `response.create`'s `input`.

Error codes and texts are OpenAI's where clients match on them.
"""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.calls import is_json
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.conversation import Item, audio_ms, new_item_id
from voice_gateway.realtime.input_buffer import decode_clip
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.settings import SessionSettings


class ClientItemReader:
    """Reads client items for one session: its input audio format, its limits; owns no state."""

    def __init__(self, settings: SessionSettings, checks: RequestChecks, reporter: ErrorReporter) -> None:
        self.settings = settings
        self.checks = checks
        self.reporter = reporter

    def read(self, src: ev.ConversationItem, event_id: str | None, where: str = "item") -> Item | None:
        """`src` as an `Item`; None where it cannot be one, the client told why (`where`: the item's param)."""
        if isinstance(src, ev.MessageItem):
            return self._message_item(src, event_id, where)
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

    def _message_item(self, src: ev.MessageItem, event_id: str | None, where: str) -> Item | None:
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
        return Item(src.id or new_item_id(), src.role, text=text, audio=samples,
                    audio_ms=audio_ms(samples) if samples is not None else 0)
