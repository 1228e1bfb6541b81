"""Which prompts the orchestrator builds on the event loop and which in a worker thread."""

from __future__ import annotations

import numpy as np

from engine.api import AudioPart, Message, TextPart
from engine.orchestrator import _INLINE_PROMPT_CHARS, _needs_worker


def test_short_text_builds_inline_audio_and_long_text_in_a_thread() -> None:
    text = (Message("system", (TextPart("Be brief."),)), Message("user", (TextPart("hello " * 40),)))
    assert not _needs_worker(text)
    with_audio = (*text, Message("user", (TextPart("and this:"), AudioPart(np.zeros(1600, dtype=np.float32)))))
    assert _needs_worker(with_audio)
    half = "x" * (_INLINE_PROMPT_CHARS // 2 + 1)  # long only together: the total counts
    assert _needs_worker((Message("user", (TextPart(half),)), Message("user", (TextPart(half),))))
