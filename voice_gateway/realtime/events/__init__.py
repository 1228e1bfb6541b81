"""The OpenAI Realtime protocol: every client and server event as a pydantic model, parsed and serialised here only.

`dialect` (GA / beta and beta's names), `session` (SessionConfig, its payload, the update fields), `updates`
(how client events change a config), `items` (message items), `client` (client events, `parse_client_event`),
`server` (server events, `serialize`), on `wire` (the base model, base64 audio).

One set of models serves two dialects. GA (`client.realtime.connect`) is the native shape.
Beta (`client.beta.realtime.connect`, which sends `OpenAI-Beta: realtime=v1`) differs in the
session object (flat `modalities`, `input_audio_format`, `turn_detection`, `voice`), in the
names of a few server events and in the type of assistant content parts (`text`/`audio` for
`output_text`/`output_audio`). Client events are accepted in either spelling on any connection;
`serialize` writes server events in the connection's dialect.

Opus is our extension: output format `{"type": "audio/opus"}` (GA) or `"opus"` (beta). Such a
session's audio leaves as binary WebSocket messages (framed by `audio/opus.py`) instead of
`response.output_audio.delta` events; everything else is unchanged.
"""

from voice_gateway.realtime.events.client import (
    ClientEvent,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    OutputAudioBufferClear,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse_client_event,
)
from voice_gateway.realtime.events.dialect import (
    Dialect,
    dialect_for,
)
from voice_gateway.realtime.events.items import (
    ContentPart,
    MessageItem,
)
from voice_gateway.realtime.events.server import (
    ContentPartAdded,
    ContentPartDone,
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    ErrorDetail,
    ErrorEvent,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputTokenDetails,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    OutputAudioDelta,
    OutputAudioDone,
    OutputAudioTranscriptDelta,
    OutputAudioTranscriptDone,
    OutputItemAdded,
    OutputItemDone,
    OutputPart,
    OutputTextDelta,
    OutputTextDone,
    OutputTokenDetails,
    RealtimeResponse,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    StatusDetails,
    Usage,
    serialize,
)
from voice_gateway.realtime.events.session import (
    SEMANTIC_SILENCE_MS,
    AudioFormat,
    ResponseOverrides,
    SessionConfig,
    SessionFields,
    TurnDetection,
    session_payload,
)
from voice_gateway.realtime.events.updates import (
    apply_response_overrides,
    apply_session_update,
)

__all__ = [
    "SEMANTIC_SILENCE_MS",
    "AudioFormat",
    "ClientEvent",
    "ContentPart",
    "ContentPartAdded",
    "ContentPartDone",
    "ConversationItemAdded",
    "ConversationItemCreate",
    "ConversationItemDelete",
    "ConversationItemDeleted",
    "ConversationItemDone",
    "ConversationItemRetrieve",
    "ConversationItemRetrieved",
    "ConversationItemTruncate",
    "ConversationItemTruncated",
    "Dialect",
    "ErrorDetail",
    "ErrorEvent",
    "InputAudioAppend",
    "InputAudioClear",
    "InputAudioCleared",
    "InputAudioCommit",
    "InputAudioCommitted",
    "InputAudioTimeoutTriggered",
    "InputTokenDetails",
    "MessageItem",
    "OutputAudioBufferClear",
    "OutputAudioBufferCleared",
    "OutputAudioBufferStarted",
    "OutputAudioBufferStopped",
    "OutputAudioDelta",
    "OutputAudioDone",
    "OutputAudioTranscriptDelta",
    "OutputAudioTranscriptDone",
    "OutputItemAdded",
    "OutputItemDone",
    "OutputPart",
    "OutputTextDelta",
    "OutputTextDone",
    "OutputTokenDetails",
    "ProtocolError",
    "RealtimeResponse",
    "ResponseCancel",
    "ResponseCreate",
    "ResponseCreated",
    "ResponseDone",
    "ResponseOverrides",
    "ServerEvent",
    "SessionConfig",
    "SessionCreated",
    "SessionFields",
    "SessionUpdate",
    "SessionUpdated",
    "SpeechStarted",
    "SpeechStopped",
    "StatusDetails",
    "TurnDetection",
    "Usage",
    "apply_response_overrides",
    "apply_session_update",
    "dialect_for",
    "parse_client_event",
    "serialize",
    "session_payload",
]
