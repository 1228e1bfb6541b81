"""Text -> IPA phonemes the way Piper phonemizes: owns the ctypes binding to libespeak-ng and the lock around its one
per-process state. As in Piper, a clause's punctuation mark is kept as a phoneme (followed by a space after
, : ;), . ? ! end a sentence, and phonemes are the codepoints after NFD. Emoji are dropped (espeak-ng would read
out their names); a text with no letter or digit has no phonemes."""

from __future__ import annotations

import ctypes
import functools
import re
import threading
import unicodedata

_EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\ufe0e\ufe0f\u200d\u20e3\U000e0020-\U000e007f]")
_LANGUAGE_SWITCH = re.compile(r"\([^)]+\)")  # espeak-ng's "(fr)...(en)" around words it reads in another language

_ESPEAK_LOCK = threading.Lock()  # espeak-ng keeps one state per process (voice, clause reader)
_AUDIO_OUTPUT_SYNCHRONOUS, _CHARS_UTF8, _PHONEMES_IPA = 2, 1, 0x02
_INITIALIZE_DONT_EXIT = 0x8000  # without it a missing data directory ends the process
_MARKS = ".?!,:;"  # the clause marks Piper keeps; . ? ! end a sentence


@functools.cache
def _espeak() -> ctypes.CDLL:
    """libespeak-ng, initialised once per process; the caller holds `_ESPEAK_LOCK`."""
    try:
        lib = ctypes.CDLL("libespeak-ng.so.1")
    except OSError as e:
        raise RuntimeError(f"the Piper voice needs espeak-ng's library (Debian: apt-get install espeak-ng): {e}") from e
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
    lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
    if lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, _INITIALIZE_DONT_EXIT) < 0:
        raise RuntimeError("espeak-ng did not initialise: its data directory (espeak-ng-data) is missing")
    return lib


def _set_voice(lib: ctypes.CDLL, espeak_voice: str) -> None:
    if lib.espeak_SetVoiceByName(espeak_voice.encode()) != 0:
        raise ValueError(f"espeak-ng has no voice {espeak_voice!r}")


def check_voice(espeak_voice: str) -> None:
    """Raises now, at start-up, when espeak-ng or its voice `espeak_voice` is missing."""
    with _ESPEAK_LOCK:
        _set_voice(_espeak(), espeak_voice)


def _clauses(text: str, espeak_voice: str) -> list[tuple[str, str, bool]]:
    """(IPA, source text, is last) per clause, as espeak-ng's clause reader cuts `text`."""
    raw = text.encode()
    with _ESPEAK_LOCK:
        lib = _espeak()
        _set_voice(lib, espeak_voice)
        buffer = ctypes.create_string_buffer(raw)
        base = ctypes.addressof(buffer)
        cursor = ctypes.c_void_p(base)
        start, found = 0, []
        while cursor.value is not None:
            ipa = lib.espeak_TextToPhonemes(ctypes.byref(cursor), _CHARS_UTF8, _PHONEMES_IPA) or b""
            end = len(raw) if cursor.value is None else cursor.value - base
            found.append((ipa.decode(), raw[start:end].decode(errors="replace"), cursor.value is None or end <= start))
            if end <= start:
                break
            start = end
    return found


def _terminator(source: str, last: bool) -> tuple[str, bool]:
    """The mark Piper keeps after a clause, and whether it ends a sentence. Piper gets both from a patched espeak-ng
    (`espeak_TextToPhonemesWithTerminator`, not in Debian's 1.51); here they come from the clause's text by the rules
    of espeak-ng's clause reader: the first mark of a final run (`?!` is `?`), none after an ellipsis (a pause within
    the sentence) or before a blank line (a paragraph), and an unmarked last clause ends a sentence."""
    if not last:
        source = source[:-1]  # the reader took the next clause's first character ahead
    body = source.rstrip()
    if source[len(body) :].count("\n") >= 2:
        return "", True
    if body.endswith(("...", "\u2026")):
        return "", False
    run = len(body) - len(body.rstrip(_MARKS))
    if run:
        mark = body[-run]
        return mark, mark in ".?!"
    return "", last


def phonemize(text: str, espeak_voice: str) -> list[list[str]]:
    """Piper's phonemes for `text`, one list per sentence (empty when nothing in it is speakable)."""
    text = _EMOJI.sub("", text).replace("\0", " ")
    if not any(c.isalnum() for c in text):
        return []
    sentences: list[list[str]] = []
    current: list[str] = []
    for ipa, source, last in _clauses(text, espeak_voice):
        mark, ends_sentence = _terminator(source, last)
        # Piper adds nothing after an unmarked clause that goes on ("Wait... what" -> "wˈeɪtwˌʌt"): a space here
        spaced = " " if mark in (",", ":", ";") or not (mark or ends_sentence or last) else ""
        current.extend(unicodedata.normalize("NFD", _LANGUAGE_SWITCH.sub("", ipa) + mark + spaced))
        if ends_sentence:
            sentences.append(current)
            current = []
    sentences.append(current)
    return [s for s in sentences if any(p not in _MARKS and not p.isspace() for p in s)]
