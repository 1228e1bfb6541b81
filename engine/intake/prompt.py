"""Chat messages -> Thinker prompt: token ids in Qwen3-Omni's chat format plus log-mel audio features.

Audio gets the Qwen3-Omni processor's 16 kHz, 128-bin log-mels; a clip becomes `<|audio_start|>`, one
`<|audio_pad|>` per encoder frame, `<|audio_end|>`. Images and videos: engine/intake/images.py. Message text is
data: a `<|im_start|>` typed by a user is those characters, never the control token. Tools follow Qwen3's chat
template: their JSON in the system turn's `# Tools` section, calls as `<tool_call>` blocks, a run of results as
one user turn of `<tool_response>` blocks."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch
from tokenizers import Tokenizer

from engine.api import INPUT_SAMPLE_RATE_HZ, AudioPart, EngineError, ImagePart, Message, TextPart, Tool, VideoPart
from engine.handoff import ImageInput, Transcript
from engine.intake.images import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, ImagePreprocessor
from engine.positions import mrope_positions, video_layout

AUDIO_START = "<|audio_start|>"
AUDIO_PAD = "<|audio_pad|>"
AUDIO_END = "<|audio_end|>"
MAX_AUDIO_SECONDS = 600
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

# Qwen3's chat template, word for word, around the tools' JSON
_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)


def audio_output_frames(num_mel_frames: int, n_window: int = 50) -> int:
    """The audio encoder's output length for `num_mel_frames` inputs (Qwen3-Omni's formula)."""
    chunk = n_window * 2
    leave = num_mel_frames % chunk
    feat = (leave - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (num_mel_frames // chunk) * 13


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    # One entry per audio clip, in prompt order: [128, frames] log-mel features.
    audio_features: list[torch.Tensor] = field(default_factory=list)
    audio_tokens: int = 0  # of token_ids, the <|audio_pad|> placeholders
    # per clip, its identity for prefix reuse (engine/omni/runners/prefix_cache.py): a digest of its samples,
    # negative, so that no token id equals it
    audio_keys: list[int] = field(default_factory=list)
    images: list[ImageInput] = field(default_factory=list)  # images and videos, in prompt order
    image_tokens: int = 0  # of token_ids, the <|image_pad|> and <|video_pad|> placeholders
    # [3, n] M-RoPE rows when the prompt holds images (engine/positions.py); None: every row is the token's index
    positions: np.ndarray | None = None
    heard: Transcript | None = None  # where the prompt was built by hearing its clips first (the cascade's ears)

class Prompts(Protocol):
    """What the front door builds prompts with: a `PromptBuilder`, or one that hears speech first (the cascade's)."""

    @property
    def tokenizer(self) -> Any: ...

    def build(self, messages: tuple[Message, ...], tools: tuple[Tool, ...] = ()) -> Prompt: ...


# Features of the clips seen lately, up to this many bytes (a 4 s clip's are 200 KiB): a conversation sends
# its earlier turns' audio with every new turn, and turning a clip into features again costs CPU on the server
# process that serves the call's audio. Held by bytes, not by count: a count small enough for memory lets long
# calls recompute every clip of their histories each turn. 512 MiB holds 80 turns of ~30 calls per process.
RECENT_FEATURE_BYTES = 512 << 20
# A conversation's prompt is its whole history, every turn: its texts (the instructions, every earlier turn's
# words, the template's pieces) are tokenized once each, up to this many distinct ones (8 KiB each at most: the
# text and its ids as int32); a text longer than MAX_REMEMBERED_TEXT characters is tokenized every time.
REMEMBERED_TEXTS = 4096
MAX_REMEMBERED_TEXT = 4096


class PromptBuilder:
    """`images`: how images become the vision tower's input, `videos` how a video's frames do (its budget is per
    frame), None for a model that takes none; `positions_per_second`: M-RoPE's time positions a second of video."""

    def __init__(self, tokenizer, feature_extractor, *, n_window: int, images: ImagePreprocessor | None = None,
                 videos: ImagePreprocessor | None = None, positions_per_second: int = 13) -> None:
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.n_window = n_window
        self.images = images
        self.videos = videos
        self.positions_per_second = positions_per_second
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        # the Rust tokenizer when there is one: the same ids without transformers' Python around each call
        # (the server's event loop tokenizes several pieces a turn, in every burst); copies of our own,
        # since transformers' encode(split_special_tokens=...) sets its backend's flag and leaves it there
        self._backend = _copy(getattr(tokenizer, "backend_tokenizer", None), plain_text=False)
        self._content = _copy(self._backend, plain_text=True)
        # clip or image key -> features; builds run in threads
        self._recent: OrderedDict[int, torch.Tensor | ImageInput] = OrderedDict()
        self._recent_bytes = 0
        self._lock = threading.Lock()
        self._digests: dict[int, tuple[weakref.ref, int]] = {}
        self._single: dict[str, list[int]] = {}
        self._remembered = functools.lru_cache(maxsize=REMEMBERED_TEXTS)(self._tokenize)  # thread-safe

    # the copies' settings do not survive pickling (the engine process sends this builder to its server)
    def __getstate__(self) -> dict:
        held = ("_content", "_recent", "_recent_bytes", "_lock", "_digests", "_remembered")
        return {k: v for k, v in self.__dict__.items() if k not in held}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._backend = _copy(self._backend, plain_text=False)
        self._content = _copy(self._backend, plain_text=True)
        self._recent, self._recent_bytes, self._lock, self._digests = OrderedDict(), 0, threading.Lock(), {}
        self._remembered = functools.lru_cache(maxsize=REMEMBERED_TEXTS)(self._tokenize)

    def build(self, messages: tuple[Message, ...], tools: tuple[Tool, ...] = ()) -> Prompt:
        ids: list[int] = []
        features: list[torch.Tensor] = []
        keys: list[int] = []
        images: list[ImageInput] = []
        image_spans: list[tuple[int, int]] = []
        audio_tokens = 0
        if tools:
            # a response may be asked for before anything was said and with no instructions: no messages at all
            system = messages[0] if messages and messages[0].role == "system" else None
            ids += self._tools_turn(system, tools)
            messages = messages[1:] if system is not None else messages
        for i, message in enumerate(messages):
            if message.role == "tool":  # a run of results is one user turn
                if i == 0 or messages[i - 1].role != "tool":
                    ids += self._encode("<|im_start|>user")
                ids += self._encode("\n<tool_response>\n")
            else:
                ids += self._encode(f"<|im_start|>{message.role}\n")
            for part in message.content:
                if isinstance(part, TextPart):
                    ids += self._encode_text(part.text)
                elif isinstance(part, AudioPart):
                    key, mel = self._clip(part.samples)
                    features.append(mel)
                    keys.append(key)
                    num_pads = audio_output_frames(mel.shape[-1], self.n_window)
                    audio_tokens += num_pads
                    ids += self._placeholders((AUDIO_START, 1), (AUDIO_PAD, num_pads), (AUDIO_END, 1))
                elif isinstance(part, ImagePart | VideoPart):
                    if message.role != "user":  # the Talker reads images from user turns only, as the model does
                        raise EngineError(f"images and videos go in user messages, not in a {message.role} message")
                    if isinstance(part, VideoPart) and part.audio is not None:  # frames and sound, by time
                        key, mel = self._clip(part.audio)
                        features.append(mel)
                        keys.append(key)
                        image = self._video(part, sound=(key, audio_output_frames(mel.shape[-1], self.n_window)))
                        audio_tokens += image.audio_tokens
                        frames = video_layout(image.grid, image.merge)
                        ids += self._encode(VISION_START + AUDIO_START)
                        image_spans.append((len(ids), len(ids) + len(frames)))
                        ids += self._encode("".join(VIDEO_PAD if f else AUDIO_PAD for f in frames) + AUDIO_END
                                            + VISION_END)
                    else:
                        image = self._image(part.pixels) if isinstance(part, ImagePart) else self._video(part)
                        ids += self._placeholders((VISION_START, 1))
                        image_spans.append((len(ids), len(ids) + image.tokens))
                        pad = VIDEO_PAD if image.is_video else IMAGE_PAD
                        ids += self._placeholders((pad, image.tokens), (VISION_END, 1))
                    images.append(image)
            has_text = any(isinstance(p, TextPart) and p.text for p in message.content)
            for k, call in enumerate(message.tool_calls):
                if k or has_text:
                    ids += self._encode("\n")
                ids += self._encode(f'{TOOL_CALL_START}\n{{"name": "')
                ids += self._encode_text(f'{call.name}", "arguments": {call.arguments}')
                ids += self._encode(f"}}\n{TOOL_CALL_END}")
            if message.role != "tool":
                ids += self._encode("<|im_end|>\n")
            else:
                ids += self._encode("\n</tool_response>")
                if i + 1 == len(messages) or messages[i + 1].role != "tool":
                    ids += self._encode("<|im_end|>\n")
        ids += self._encode("<|im_start|>assistant\n")
        positions = None
        if images:
            positions = mrope_positions(len(ids), image_spans, [i.grid for i in images], images[0].merge)
        return Prompt(token_ids=ids, audio_features=features, audio_tokens=audio_tokens, audio_keys=keys, images=images,
                      image_tokens=sum(i.tokens for i in images), positions=positions)

    def _tools_turn(self, system: Message | None, tools: tuple[Tool, ...]) -> list[int]:
        ids = self._encode("<|im_start|>system\n")
        if system is not None:
            for part in system.content:
                if isinstance(part, TextPart):
                    ids += self._encode_text(part.text)
            ids += self._encode("\n\n")
        ids += self._encode(_TOOLS_HEAD)
        for tool in tools:
            function: dict = {"name": tool.name}
            if tool.description is not None:
                function["description"] = tool.description
            if tool.parameters is not None:
                function["parameters"] = tool.parameters
            # the template's `tojson`: json.dumps' spacing, non-ASCII kept
            ids += self._encode_text("\n" + json.dumps({"type": "function", "function": function}, ensure_ascii=False))
        return ids + self._encode(_TOOLS_TAIL + "<|im_end|>\n")

    def _encode(self, text: str) -> list[int]:
        """Our own template text: its special tokens are meant."""
        return self._ids(text, special=True)

    def _placeholders(self, *runs: tuple[str, int]) -> list[int]:
        """Runs of special tokens (`<|audio_pad|>` x frames, ...) without tokenizing their text: each is one id,
        repeated, and a history's clips are laid out again every turn."""
        ids: list[int] = []
        for token, count in runs:
            if (single := self._single.get(token)) is None:
                single = self._single[token] = self._encode(token)
            ids += single * count if len(single) == 1 else self._encode(token * count)
        return ids

    def _encode_text(self, text: str) -> list[int]:
        """A message's text: special tokens in it are plain characters."""
        return self._ids(text, special=False)

    def _ids(self, text: str, *, special: bool) -> list[int]:
        """A list of the caller's own: remembered for a text of at most MAX_REMEMBERED_TEXT characters."""
        remember = len(text) <= MAX_REMEMBERED_TEXT
        return (self._remembered(text, special) if remember else self._tokenize(text, special)).tolist()

    def _tokenize(self, text: str, special: bool) -> np.ndarray:
        """`special`: the text's special tokens are meant (our template's), else plain characters (a message's)."""
        if special:
            ids = (self._backend.encode(text, add_special_tokens=False).ids if self._backend is not None
                   else self.tokenizer.encode(text, add_special_tokens=False))
        elif self._content is not None:
            ids = self._content.encode(text, add_special_tokens=False).ids
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        return np.asarray(ids, dtype=np.int32)

    def _digest(self, data: np.ndarray, person: bytes = b"") -> int:
        """A contiguous clip's or image's key: a digest of its bytes, taken once per array, since a conversation hands
        its history's arrays back every turn. An array is never changed in place once it is a message's."""
        known = self._digests.get(id(data))
        if known is not None and known[0]() is data:
            return known[1]
        key = -1 - int.from_bytes(hashlib.blake2b(data.tobytes(), digest_size=7, person=person).digest(), "little")
        # the entry goes with its array, before the array's id can name another; no lock: a single dict
        # operation is atomic, and a lock taken again by a collection inside it would deadlock
        self._digests[id(data)] = (weakref.ref(data, functools.partial(_forget, self._digests, id(data))), key)
        return key

    def _clip(self, samples: np.ndarray) -> tuple[int, torch.Tensor]:
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        key = self._digest(samples)
        if (mel := self._seen(key)) is not None:
            assert isinstance(mel, torch.Tensor)
            return key, mel
        mel = self._features(samples)
        self._remember(key, mel)
        return key, mel

    def _image(self, pixels: np.ndarray) -> ImageInput:
        """An image's vision input, computed once for images seen lately (a conversation resends its images)."""
        if self.images is None:
            raise EngineError("this model takes no images", code="images_not_supported")
        pixels = np.ascontiguousarray(pixels)
        key = self._digest(pixels, b"image")
        if (image := self._seen(key)) is not None:
            assert isinstance(image, ImageInput)
            return image
        image = self.images(pixels, key)
        self._remember(key, image)
        return image

    def _video(self, video: VideoPart, sound: tuple[int, int] | None = None) -> ImageInput:
        """A video's vision input, computed once for videos seen lately; `sound`: its clip's key and audio tokens,
        when they interleave with the frames (the video's key then names both)."""
        if self.videos is None:
            raise EngineError("this model takes no videos", code="images_not_supported")
        frames = np.ascontiguousarray(video.frames)
        digest = hashlib.blake2b(frames.tobytes(), digest_size=7, person=b"video")
        digest.update(repr((frames.shape, video.fps)).encode())
        key = -1 - int.from_bytes(digest.digest(), "little")
        if (seen := self._seen(key)) is None:
            seen = self.videos.video(frames, video.fps, key, self.positions_per_second)
            self._remember(key, seen)
        assert isinstance(seen, ImageInput)
        if sound is None:
            return seen
        clip, tokens = sound
        digest.update(clip.to_bytes(8, "little", signed=True))
        return replace(seen, key=-1 - int.from_bytes(digest.digest(), "little"), audio_tokens=tokens)

    def _seen(self, key: int) -> torch.Tensor | ImageInput | None:
        with self._lock:
            if (value := self._recent.get(key)) is not None:
                self._recent.move_to_end(key)
            return value

    def _remember(self, key: int, value: torch.Tensor | ImageInput) -> None:
        with self._lock:
            if key not in self._recent:
                self._recent[key] = value
                self._recent_bytes += _nbytes(value)
            while self._recent_bytes > RECENT_FEATURE_BYTES:
                self._recent_bytes -= _nbytes(self._recent.popitem(last=False)[1])

    def _features(self, samples: np.ndarray) -> torch.Tensor:
        if samples.ndim != 1 or samples.size < INPUT_SAMPLE_RATE_HZ // 100:
            raise EngineError("input audio must be mono and at least 10 ms long")
        # the filterbank pads each end by half a window (reflect), which needs more samples than that: a clip
        # of 10 to 12.5 ms gets silence after it
        min_samples = self.feature_extractor.n_fft // 2 + 1
        if samples.size < min_samples:
            samples = np.pad(samples, (0, min_samples - samples.size))
        if samples.size > MAX_AUDIO_SECONDS * INPUT_SAMPLE_RATE_HZ:
            raise EngineError(f"input audio is longer than {MAX_AUDIO_SECONDS} s")
        out = self.feature_extractor(
            samples.astype(np.float32),
            sampling_rate=INPUT_SAMPLE_RATE_HZ,
            padding=True,
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        valid = int(out["attention_mask"][0].sum())
        return out["input_features"][0, :, :valid]


def _forget(digests: dict[int, tuple[weakref.ref, int]], ident: int, _: weakref.ref) -> None:
    digests.pop(ident, None)


def _nbytes(value: torch.Tensor | ImageInput) -> int:
    return value.pixels.nbytes if isinstance(value, ImageInput) else value.nbytes


def _copy(backend: Tokenizer | None, *, plain_text: bool) -> Tokenizer | None:
    """A copy of the Rust tokenizer reading special-token text as plain text or as the tokens; None without one."""
    if backend is None:
        return None
    copy = Tokenizer.from_str(backend.to_str())
    copy.encode_special_tokens = plain_text
    return copy
