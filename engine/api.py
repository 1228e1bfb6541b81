"""The engine's public types: requests in, typed output events out, and the `Engine` protocol."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from prometheus_client import CollectorRegistry

SAMPLE_RATE_HZ = 24_000
INPUT_SAMPLE_RATE_HZ = 16_000


# `code`s of refusals that are the server's state, not the request's fault: the client may try again
OVERLOADED = "server_overloaded"  # every slot busy and the queue full, or the queue's deadline passed
UNAVAILABLE = "engine_unavailable"  # the engine process is down, stalled or restarting


class EngineError(Exception):
    """A request the engine cannot take; the message is safe to show a client. `retry_after_s`: for a
    refusal that is the server's state (`OVERLOADED`, `UNAVAILABLE`), when trying again makes sense."""

    def __init__(self, message: str, code: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class AudioPart:
    """Mono float32 audio in [-1, 1] at 16 kHz (the Thinker's audio encoder rate)."""

    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An RGB image, [height, width, 3] uint8, decoded and bounded by the edge (voice_gateway/media/images.py)."""

    pixels: np.ndarray


@dataclass(frozen=True, slots=True)
class VideoPart:
    """A video's frames, RGB uint8 [n, height, width, 3], sampled `fps` a second by the edge; `audio`: its own
    sound over those frames' time (mono float32 at 16 kHz), when the request asked for it (Qwen3-Omni's
    `use_audio_in_video`: frames and sound interleave by time in the prompt). Sound the request did not tie
    to the video comes as an AudioPart of its own."""

    frames: np.ndarray
    fps: float
    audio: np.ndarray | None = None


ContentPart = TextPart | AudioPart | ImagePart | VideoPart


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made, as the client sends it back: `arguments` is JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    """`role` "tool": a tool's result (its content); an assistant's `tool_calls` follow its content."""

    role: Literal["system", "user", "assistant", "tool"]
    content: tuple[ContentPart, ...]
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; `parameters`: the JSON Schema of its arguments (None: any object)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class JsonOutput:
    """The reply is one JSON value that `schema` accepts (None: any JSON object)."""

    schema: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallOutput:
    """The reply is tool calls only: to `name` (None: any tool), one, or (`parallel`) one or more."""

    name: str | None = None
    parallel: bool = True


# what constrained decoding holds a reply to (engine/intake/constraints.py)
OutputConstraint = JsonOutput | ToolCallOutput


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling. `None` means the deploy profile's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    messages: tuple[Message, ...]
    want_audio: bool = True
    speaker: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: tuple[Tool, ...] = ()  # described in the prompt; calls come back as `<tool_call>` text
    output: OutputConstraint | None = None
    # the client's name for the conversation (chat's `prompt_cache_key` or `user`, a realtime session's id):
    # every server process sends its turns to the same replica, where their prefix is kept
    conversation: str | None = None
    # "transcribe": the reply is the words of the last message's audio (a realtime item's input transcription).
    # The Omni engine's Thinker answers it as any request; an engine that hears before it thinks (the
    # assistant's) answers from its ears and runs no model after them.
    task: Literal["reply", "transcribe"] = "reply"
    # a turn of a live conversation (a realtime session, a phone call): its caller cannot try it again later, so
    # where every place is taken it waits longer for one (the profile's `admission.live_queue_timeout_s`)
    live_turn: bool = False


@dataclass(frozen=True, slots=True)
class TextDelta:
    request_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """Float32 mono PCM at 24 kHz; `sample_offset` is where it starts in the reply."""

    request_id: str
    samples: np.ndarray
    sample_offset: int
    is_last: bool


@dataclass(frozen=True, slots=True)
class Timings:
    """Engine-side clock, seconds from submit (client-side numbers live in the bench)."""

    ttft_s: float | None
    ttfp_s: float | None
    total_s: float
    prompt_tokens: int
    prompt_audio_tokens: int  # of prompt_tokens, those standing for input audio
    completion_tokens: int
    codec_frames: int
    audio_samples: int
    cached_tokens: int = 0  # of prompt_tokens, those reused from a cached prefix rather than prefilled
    prompt_image_tokens: int = 0  # of prompt_tokens, those standing for input images
    first_packet: FirstPacketParts | None = None  # where ttfp_s went, for a spoken reply of the Omni engine


@dataclass(frozen=True, slots=True)
class FirstPacketParts:
    """A spoken reply's first packet (`Timings.ttfp_s`) split where its stages passed it on; they add up to it.
    A stage that was ahead of the one before it (the Talker prefills a prompt while the Thinker does) adds 0."""

    queued_s: float  # submit -> the Thinker takes it from its queue
    thinker_s: float  # -> its first token (the prompt's prefill, or what a kept prefix left of it)
    talker_prefill_s: float  # -> the Talker holds the prompt's rows and the reply's header
    talker_frames_s: float  # -> Code2Wav begins its first chunk (the Talker made that chunk's frames)
    code2wav_s: float  # -> the first packet

    @property
    def total_s(self) -> float:
        return self.queued_s + self.thinker_s + self.talker_prefill_s + self.talker_frames_s + self.code2wav_s


@dataclass(frozen=True, slots=True)
class Finished:
    request_id: str
    finish_reason: Literal["stop", "length"]
    timings: Timings


@dataclass(frozen=True, slots=True)
class Failed:
    """The request's last event when it did not finish. `code`: `OVERLOADED` or `UNAVAILABLE` when the
    server's state refused or ended it (before any output, for a refusal), None for a failure."""

    request_id: str
    reason: str
    code: str | None = None
    retry_after_s: float | None = None


OutputEvent = TextDelta | AudioChunk | Finished | Failed


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """Whether the engine can serve now. `ok`; `degraded`: it serves, but its process has been silent
    for longer than it should (not yet a stall); `down`: it cannot (not started, stopped, or its
    process lost and being started again), and a request is refused with `UNAVAILABLE`.
    `restarts`: engine processes started (or, for a server process attached to another's, joined)
    after one was lost, since this server started. `retry_after_s`: when down, when it may serve.
    `capacity`: what the engine holds at once, where it sized itself to its GPU (engine/omni/memory.py)."""

    status: Literal["ok", "degraded", "down"]
    detail: str = ""  # why it is not ok
    restarts: int = 0
    retry_after_s: float | None = None
    capacity: str = ""

    def refusal(self) -> EngineError:
        """The error a request gets while the engine is down."""
        return EngineError(f"the engine is unavailable: {self.detail}", code=UNAVAILABLE,
                           retry_after_s=self.retry_after_s)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model_id: str
    is_random_weights: bool
    description: str
    max_model_len: int
    speakers: tuple[str, ...]
    codec_frame_samples: int
    temperature: float  # what a request that names none samples at (its profile's): realtime sessions start at it
    # an image is resized to at most this many pixels (one prompt token per 32 x 32); 0: the model takes no images
    max_image_pixels: int = 0
    # it makes a user's speech text before it thinks, and keeps each clip's words: the edge may have it hear a turn
    # while the turn may still go on (a realtime session's turn detection judges pauses on those words, and the
    # reply finds the turn heard)
    listens_ahead: bool = False


class RequestStream(Protocol):
    request_id: str

    def __aiter__(self) -> AsyncIterator[OutputEvent]: ...

    async def __anext__(self) -> OutputEvent: ...

    async def aclose(self) -> None:
        """Stop listening; aborts the request if it has not finished."""
        ...


class Engine(Protocol):
    """What the network edge needs from the engine."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def registry(self) -> CollectorRegistry: ...

    async def submit(self, request: EngineRequest) -> RequestStream:
        """Start a request (raises EngineError when it cannot be taken); iterate the stream for its events."""
        ...

    def abort(self, request_id: str) -> None:
        """Remove a request from every stage within one step; safe to call twice."""
        ...

    def num_active_requests(self) -> int: ...

    def stage_load(self) -> dict[str, int]:
        """Requests each stage still holds, by stage name."""
        ...

    def health(self) -> EngineHealth: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


__all__ = [
    "SAMPLE_RATE_HZ",
    "INPUT_SAMPLE_RATE_HZ",
    "AudioChunk",
    "AudioPart",
    "ContentPart",
    "Engine",
    "EngineError",
    "EngineHealth",
    "EngineRequest",
    "Failed",
    "Finished",
    "JsonOutput",
    "Message",
    "ModelInfo",
    "OutputConstraint",
    "OutputEvent",
    "RequestStream",
    "SamplingParams",
    "TextDelta",
    "TextPart",
    "Timings",
    "Tool",
    "ToolCall",
    "ToolCallOutput",
]
