"""The engine's face: what `voice_gateway` may import for requests, and nothing else.

Requests in (`EngineRequest`, with `Tool`s and an `OutputConstraint` when it has them), typed events out
(`TextDelta`, `AudioChunk`, `Finished`, `Failed`), an `Engine` to submit them to (`create_engine`, where the
deploy profile says: `load_profile`, `DeployProfile`). What runs one engine for several server processes
and reaches it from each is the deploy face, engine/deploy.py.
"""

from engine.api import (
    INPUT_SAMPLE_RATE_HZ,
    OVERLOADED,
    SAMPLE_RATE_HZ,
    UNAVAILABLE,
    AudioChunk,
    AudioPart,
    ContentPart,
    Engine,
    EngineError,
    EngineHealth,
    EngineRequest,
    Failed,
    Finished,
    FirstPacketParts,
    ImagePart,
    JsonOutput,
    Message,
    ModelInfo,
    OutputConstraint,
    OutputEvent,
    RequestStream,
    SamplingParams,
    TextDelta,
    TextPart,
    Timings,
    Tool,
    ToolCall,
    ToolCallOutput,
    VideoPart,
)
from engine.factory import create_engine
from engine.intake.constraints import schema_error
from engine.profile import DeployProfile, ProfileError, load_profile

__all__ = [
    "INPUT_SAMPLE_RATE_HZ",
    "OVERLOADED",
    "SAMPLE_RATE_HZ",
    "UNAVAILABLE",
    "AudioChunk",
    "AudioPart",
    "ImagePart",
    "ContentPart",
    "DeployProfile",
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
    "ProfileError",
    "RequestStream",
    "SamplingParams",
    "TextDelta",
    "TextPart",
    "FirstPacketParts",
    "Timings",
    "Tool",
    "ToolCall",
    "ToolCallOutput",
    "VideoPart",
    "create_engine",
    "load_profile",
    "schema_error",
]
