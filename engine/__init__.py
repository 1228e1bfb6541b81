"""The staged speech engine's face: what `voice_gateway` may import, and nothing else.

Requests in (`EngineRequest`, with `Tool`s and an `OutputConstraint` when it has them), typed events out (`TextDelta`, `AudioChunk`, `Finished`, `Failed`),
an `Engine` to submit them to (`create_engine`), and `EngineHost` / `attach_engine` for one
engine process shared by several server processes (`ReplicaHost` / `attach_replicas` for engine
replicas on Ray). `freeze_startup_heap` / `thaw_heap`: a serving process's start-up objects out of
the cyclic collector, and back.
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
)
from engine.constraints import schema_error
from engine.factory import attach_engine, attach_replicas, create_engine
from engine.heap import freeze_startup_heap, thaw_heap
from engine.profile import DeployProfile, ProfileError, load_profile
from engine.remote.host import EngineHost
from engine.replicas.host import ReplicaHost

__all__ = [
    "INPUT_SAMPLE_RATE_HZ",
    "OVERLOADED",
    "SAMPLE_RATE_HZ",
    "UNAVAILABLE",
    "AudioChunk",
    "AudioPart",
    "ContentPart",
    "DeployProfile",
    "Engine",
    "EngineError",
    "EngineHealth",
    "EngineHost",
    "EngineRequest",
    "Failed",
    "Finished",
    "JsonOutput",
    "Message",
    "ModelInfo",
    "OutputConstraint",
    "OutputEvent",
    "ProfileError",
    "ReplicaHost",
    "RequestStream",
    "SamplingParams",
    "TextDelta",
    "TextPart",
    "Timings",
    "Tool",
    "ToolCall",
    "ToolCallOutput",
    "attach_engine",
    "attach_replicas",
    "create_engine",
    "freeze_startup_heap",
    "load_profile",
    "schema_error",
    "thaw_heap",
]
