"""The chat-completions request we accept, as pydantic models (parsed here only).

Types are strict where OpenAI's are: `stream: "yes"`, `max_tokens: "4"` or `true` and `n: "1"` are
refused, not coerced. Unions are tagged, and their tags start with `$`: the error handler drops such
tags from an error's `param`, so that it names the request's own path (`messages.0.content.1.text`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictInt, Tag

from voice_gateway.text import CleanText

StrictFloat = Annotated[float, Field(strict=True)]  # takes a JSON integer, not a string or a bool


class _Open(BaseModel):
    # OpenAI clients send fields we do not use (user, metadata, store, ...): accept and ignore them.
    model_config = ConfigDict(extra="allow")


class TextContent(_Open):
    type: Literal["text"]
    text: CleanText


class InputAudio(_Open):
    data: str
    format: Literal["wav", "mp3", "flac", "ogg", "pcm16"] = "wav"


class InputAudioContent(_Open):
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageURL(_Open):
    url: CleanText  # a data:image/...;base64 URL, or an http(s) URL on a host the server fetches from
    detail: Literal["auto", "low", "high"] = "auto"  # accepted; the engine sizes every image by its own budget


class ImageURLContent(_Open):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(_Open):
    url: CleanText  # a data:video/...;base64 URL


class VideoURLContent(_Open):
    """vLLM's extension: a video as a data URL."""

    type: Literal["video_url"]
    video_url: VideoURL


def _part_tag(part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return f"${kind}" if kind in ("text", "image_url", "input_audio", "video_url") else None


def _content_tag(content: Any) -> str | None:
    return "$text" if isinstance(content, str) else "$parts" if isinstance(content, list) else None


ContentPart = Annotated[
    Annotated[TextContent, Tag("$text")] | Annotated[ImageURLContent, Tag("$image_url")]
    | Annotated[InputAudioContent, Tag("$input_audio")] | Annotated[VideoURLContent, Tag("$video_url")],
    Discriminator(_part_tag, custom_error_type="invalid_content_part",
                  custom_error_message="a content part's type must be 'text', 'image_url', 'input_audio' or 'video_url'"),
]
Content = Annotated[
    Annotated[CleanText, Tag("$text")] | Annotated[list[ContentPart], Tag("$parts")],
    Discriminator(_content_tag, custom_error_type="invalid_content",
                  custom_error_message="content must be a string or a list of content parts"),
]


FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule for a function's name


class FunctionCall(_Open):
    name: FunctionName
    arguments: CleanText  # JSON text, as the model wrote it


class ToolCallParam(_Open):
    id: CleanText
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    tool_calls: list[ToolCallParam] | None = None  # an assistant's calls, sent back with their results
    tool_call_id: CleanText | None = None  # a tool result's call


class FunctionDef(_Open):
    name: FunctionName
    description: CleanText | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; None: no parameters
    strict: StrictBool | None = None


class ToolDef(_Open):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Open):
    name: FunctionName


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


def _choice_tag(choice: Any) -> str | None:
    return "$mode" if isinstance(choice, str) else "$named" if isinstance(choice, dict) else None


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("$mode")] | Annotated[NamedToolChoice, Tag("$named")],
    Discriminator(_choice_tag, custom_error_type="invalid_tool_choice",
                  custom_error_message="tool_choice must be 'none', 'auto', 'required' or a named function"),
]


class JsonSchemaFormat(_Open):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: CleanText | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: StrictBool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class AudioParams(_Open):
    voice: Annotated[CleanText, Field(min_length=1)] | None = None
    format: Literal["wav", "pcm16", "flac"] = "wav"


class StreamOptions(_Open):
    include_usage: StrictBool = False


class MMProcessorKwargs(_Open):
    """vLLM's per-request processor settings; of them, Qwen3-Omni's `use_audio_in_video` (every video of the
    request brings its own sound, interleaved with its frames by time)."""

    use_audio_in_video: StrictBool = False


class ChatCompletionRequest(_Open):
    model: CleanText
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: Annotated[list[Literal["text", "audio"]], Field(min_length=1)] | None = None
    audio: AudioParams | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[StrictFloat, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0.0, le=1.0)] | None = None
    seed: StrictInt | None = None
    # either names the conversation, so that its turns reach the replica that keeps its prefix
    prompt_cache_key: Annotated[CleanText, Field(max_length=512)] | None = None
    user: Annotated[CleanText, Field(max_length=512)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    mm_processor_kwargs: MMProcessorKwargs | None = None
