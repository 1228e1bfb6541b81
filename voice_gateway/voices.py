"""Voice names a client may ask for, in chat completions and realtime alike: the model's own speakers, and OpenAI's
names (which clients written for OpenAI send) mapped onto the nearest of them by register (docs/realtime.md's
table); on a model of one voice every name is that voice. A name that is neither is refused with those that exist."""

from __future__ import annotations

# OpenAI's realtime voices -> Qwen3-Omni's speakers (chelsie: female, ethan: male, aiden: male, lighter)
OPENAI_VOICES: dict[str, str] = {
    "alloy": "chelsie",
    "ash": "aiden",
    "ballad": "aiden",
    "cedar": "ethan",
    "coral": "chelsie",
    "echo": "ethan",
    "marin": "chelsie",
    "sage": "chelsie",
    "shimmer": "chelsie",
    "verse": "ethan",
}


class UnknownVoice(ValueError):
    pass


def resolve_voice(name: str, speakers: tuple[str, ...]) -> str:
    """The speaker `name` stands for on a model with `speakers` (lower-case); UnknownVoice says which exist."""
    wanted = name.lower()
    if wanted in speakers:
        return wanted
    mapped = OPENAI_VOICES.get(wanted)
    if mapped is not None and mapped in speakers:
        return mapped
    if mapped is not None and len(speakers) == 1:
        return speakers[0]
    if not speakers:
        raise UnknownVoice(f"voice {name!r}: this model has no talker, so it speaks no voice at all")
    aliases = sorted(alias for alias, speaker in OPENAI_VOICES.items() if speaker in speakers or len(speakers) == 1)
    raise UnknownVoice(f"unknown voice {name!r}; this model's speakers: {', '.join(speakers)}; "
                       f"OpenAI names mapped onto them: {', '.join(aliases)}")
