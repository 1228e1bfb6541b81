"""What a client may ask of this engine, checked before anything acts on it: text that fits the context, and
voices the engine has. A refusal becomes an `error` event; the caller leaves the request undone."""

from __future__ import annotations

from engine import Engine
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.text import MAX_CHARS_PER_TOKEN
from voice_gateway.voices import UnknownVoice, resolve_voice


class RequestChecks:
    """Checks against one engine's limits, in one session's dialect; owns no state of its own."""

    def __init__(self, engine: Engine, dialect: ev.Dialect, reporter: ErrorReporter) -> None:
        self.engine = engine  # its info is read at each check: a remote engine's may change
        self.dialect = dialect
        self.reporter = reporter

    def text_fits(self, text: str | None, what: str, event_id: str | None, param: str) -> bool:
        """Text that cannot fit the context is refused by its length alone, before any tokenizer sees it."""
        context_tokens = self.engine.info.max_model_len
        if text is None or len(text) <= MAX_CHARS_PER_TOKEN * context_tokens:
            return True
        self.reporter.error(
            "context_length_exceeded",
            f"{len(text)} characters of {what} need at least {-(-len(text) // MAX_CHARS_PER_TOKEN)} tokens; "
            f"this model's context is {context_tokens} tokens", event_id=event_id, param=param)
        return False

    def voice_exists(self, voice: str | None, event_id: str | None, where: str) -> bool:
        """`where`: "session" or "response", the object the voice was set in."""
        if voice is None:
            return True
        try:
            resolve_voice(voice, self.engine.info.speakers)
        except UnknownVoice as e:
            param = f"{where}.voice" if self.dialect is ev.Dialect.BETA else f"{where}.audio.output.voice"
            self.reporter.error("invalid_value", str(e), event_id=event_id, param=param)
            return False
        return True
