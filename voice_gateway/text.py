"""What text from the network may hold: `CleanText` refuses lone surrogates and NUL at validation.

JSON can spell a lone surrogate (`"\\ud800"`), which Python keeps in a str that no UTF-8 encoder takes:
the tokenizer raises on it, and so does every reply that echoes it. NUL has no business in a prompt.
`MAX_CHARS_PER_TOKEN` bounds how long a text can be and still fit a context, known without a tokenizer.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_FORBIDDEN = re.compile("[\x00\ud800-\udfff]")


def _clean(text: str) -> str:
    if not text.isascii() or "\x00" in text:
        found = _FORBIDDEN.search(text)
        if found is not None:
            what = "a NUL character" if found.group() == "\x00" else f"a lone surrogate (U+{ord(found.group()):04X})"
            raise ValueError(f"the text holds {what} at index {found.start()}")
    return text


CleanText = Annotated[str, AfterValidator(_clean)]


def printable(text: str) -> str:
    """`text` with anything UTF-8 cannot encode spelled as an escape, so that an error message about it can be sent."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# A Qwen BPE token is at most 128 bytes (the longest in its 151643-rank vocabulary), so at most 128
# characters: text of more than 128 characters per context token needs more tokens than the context holds,
# whatever it says. Checking that needs no tokenizer, so a huge prompt is refused before it is tokenized.
MAX_CHARS_PER_TOKEN = 128
