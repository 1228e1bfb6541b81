"""How `session.update` and `response.create` change a `SessionConfig`, whichever dialect spelled them."""

from __future__ import annotations

from typing import Any

from voice_gateway.realtime.events.client import ResponseCreate, SessionUpdate
from voice_gateway.realtime.events.session import (
    AudioFormat,
    OutputSettings,
    SessionConfig,
    format_from_ga,
    merge_turn_detection,
)


def _first(ga_value: Any, beta_value: Any) -> Any:
    return ga_value if ga_value is not None else beta_value


def _output_changes(fields: OutputSettings) -> dict[str, Any]:
    """The SessionConfig fields that `fields` sets (a null counts as absent); GA wins a tie."""
    output = fields.audio.output if fields.audio and fields.audio.output else None
    modalities = _first(fields.output_modalities, fields.modalities)
    changes = {
        "instructions": fields.instructions,
        "output_modality": None if modalities is None else ("audio" if "audio" in modalities else "text"),
        "max_output_tokens": _first(fields.max_output_tokens, fields.max_response_output_tokens),
        "temperature": fields.temperature,
        "voice": _first(output.voice if output else None, fields.voice),
        "output_audio_format": _first(format_from_ga(output.format if output else None), fields.output_audio_format),
        "tools": tuple(fields.tools) if fields.tools is not None else None,
        "tool_choice": fields.tool_choice,
    }
    return {name: value for name, value in changes.items() if value is not None}


def apply_session_update(current: SessionConfig, event: SessionUpdate) -> SessionConfig:
    """`current` with the fields the update names, in either dialect's shape; the rest stay."""
    session = event.session
    changes = _output_changes(session)
    audio_input = session.audio.input if session.audio and session.audio.input else None
    beta_input_format = AudioFormat(session.input_audio_format) if session.input_audio_format else None
    input_format = _first(format_from_ga(audio_input.format if audio_input else None), beta_input_format)
    if input_format is not None:
        changes["input_audio_format"] = input_format
    if session.truncation is not None:
        changes["truncation"] = session.truncation
    # a present-but-null turn_detection means manual turns, so presence, not value, decides
    for holder in (audio_input, session):
        if holder is not None and "turn_detection" in holder.model_fields_set:
            changes["turn_detection"] = merge_turn_detection(current.turn_detection, holder.turn_detection)
            break
    # likewise a null transcription turns it off
    if audio_input is not None and "transcription" in audio_input.model_fields_set:
        changes["transcription"] = audio_input.transcription
    elif "input_audio_transcription" in session.model_fields_set:
        changes["transcription"] = session.input_audio_transcription
    return current.model_copy(update=changes)


def apply_response_overrides(config: SessionConfig, event: ResponseCreate) -> SessionConfig:
    """The settings one response runs with: the session's, overridden by `response.create`'s."""
    if event.response is None:
        return config
    return config.model_copy(update=_output_changes(event.response))
