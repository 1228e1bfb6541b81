"""What crosses between stages: frozen payloads, the inbox each stage drains once per step, and the queue that
carries the stages' reports to the orchestrator's event loop. Stages never import each other: they meet here.

The front door admits a request (`AdmittedRequest`) and the Thinker takes it. Thinker -> Talker: the prompt
(`ThinkerPrompt`) when the Thinker begins it, its rows piece by piece as they are prefilled (`PromptRows`),
one row per decoded token (`ThinkerToken`), then `ThinkerDone`; so the Talker prefills while the Thinker still
prefills, and speaks while it still decodes. Talker -> Code2Wav: codec frames (`CodecFrames`), which Code2Wav
cuts into chunks itself. Talker -> Thinker, when the Thinker paces itself: `SpeechProgress`."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from engine.positions import Grid


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image or video as it crosses to the engine: `pixels` uint8 [frames, height, width, 3], resized to whole
    merged patches (an image is one frame), its patch grid (t, h, w); `key`: a negative digest of its pixels, which
    no token id equals (prefix reuse). The tower's input, `patches(...)`, is made where the tower runs: uint8 is a
    quarter of the float32 patches' bytes, which hold an image twice over (the temporal patch)."""

    pixels: torch.Tensor
    grid_thw: tuple[int, int, int]
    key: int
    merge: int = 2
    # a video: M-RoPE time positions from one frame pair to the next; 0 for an image (one moment)
    time_step: int = 0
    is_video: bool = False
    audio_tokens: int = 0  # a video with its sound: the sound's placeholders, interleaved with the frames'

    @property
    def grid(self) -> Grid:
        return Grid(self.grid_thw, self.time_step, self.audio_tokens)

    @property
    def tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (self.merge * self.merge)


@dataclass(frozen=True, slots=True)
class Transcript:
    """The words of a request's last message's clips, as ears heard them while its prompt was built."""

    text: str
    took_s: float


@dataclass(frozen=True, slots=True)
class AdmittedRequest:
    """Front door -> Thinker: a request checked, tokenised and bounded. It is what crosses to an engine in another
    process, so it holds no raw audio or pixels, only their features."""

    request_id: str
    token_ids: list[int]
    audio_features: list[torch.Tensor]  # one [128, frames] log-mel per clip, in prompt order
    audio_tokens: int  # of token_ids, the <|audio_pad|> placeholders
    audio_keys: list[int]  # per clip, its digest: a reused prefix holds the same audio (engine/intake/prompt.py)
    want_audio: bool
    speaker: str
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    grammar: str | None = None  # the reply's grammar (engine/intake/constraints.py), compiled by the Thinker
    # the ids that open and close a tool call, when the request has tools: what lies between them
    # (they included) is for the client, never spoken
    tool_call_ids: tuple[int, int] | None = None
    conversation: str | None = None  # EngineRequest.conversation: which replica keeps its prefix
    images: list[ImageInput] = field(default_factory=list)  # the vision tower's input per image or video, in order
    image_tokens: int = 0  # of token_ids, the <|image_pad|> and <|video_pad|> placeholders
    positions: np.ndarray | None = None  # [3, n] M-RoPE rows when the prompt holds images (engine/positions.py)
    # a transcription the front door already heard (an engine that hears before it thinks): answered with these
    # words, and no stage runs
    transcript: Transcript | None = None
    live_turn: bool = False  # EngineRequest.live_turn: how long the gate lets it wait for a place


@dataclass(frozen=True, slots=True)
class ThinkerPrompt:
    request_id: str
    token_ids: list[int]
    speaker: str
    seed: int | None
    keys: np.ndarray  # per prompt position, its key (engine/omni/runners/prefix_cache.py): what a kept prefix matches
    grids: tuple[Grid, ...] = ()  # per image or video, its patch grid: the Talker's M-RoPE rows


@dataclass(frozen=True, slots=True)
class PromptRows:
    """The prompt's next rows, in order from position 0. A reused prefix's rows stay where the prefix cache keeps them
    (host memory, on a GPU): the receiver copies only those it lacks."""

    request_id: str
    embeds: torch.Tensor  # [n, thinker_hidden]: layer-0 (input embedding) rows
    hidden: torch.Tensor  # [n, thinker_hidden]: rows of the talker's `accept_hidden_layer`
    # on a GPU, recorded on the Thinker's stream after the rows were written (on the GPU, or copied to the host):
    # sent as soon as the step is queued, they are read once the receiver's stream has waited on it
    # (engine/stage.py)
    written: torch.cuda.Event | None = None


@dataclass(frozen=True, slots=True)
class ThinkerToken:
    request_id: str
    token_id: int
    embed: torch.Tensor  # [thinker_hidden]


@dataclass(frozen=True, slots=True)
class ThinkerDone:
    request_id: str


@dataclass(frozen=True, slots=True)
class CodecFrames:
    request_id: str
    frames: torch.Tensor  # [num_quantizers, T] codes
    is_final: bool


@dataclass(frozen=True, slots=True)
class SpeechProgress:
    """Talker -> Thinker after a step: the replies that consumed one text row, and those the Talker
    finished (which need no more pacing). About many requests, so it carries no `request_id`."""

    consumed: tuple[str, ...]
    finished: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


class Inbox:
    """A stage's input: thread-safe, drained at the top of every step."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def drain(self, block_s: float | None) -> list[Any]:
        """All waiting items; waits up to `block_s` for the first when empty (None: no wait)."""
        items = []
        try:
            if block_s is not None:
                items.append(self._queue.get(timeout=block_s))
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return items

    def qsize(self) -> int:
        return self._queue.qsize()


class StickyRouter:
    """A stage's copies: a request's first payload goes to the copy with fewest requests, every later one with it."""

    _FORGOTTEN_MEMORY = 4096

    def __init__(self, inboxes: list[Inbox], is_last: Callable[[Any], bool]) -> None:
        self.inboxes = inboxes
        self.is_last = is_last
        self._owner: dict[str, int] = {}
        self.in_flight = [0] * len(inboxes)
        # payloads the sender queued before it saw an abort must not place the request again
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()  # several copies upstream may route at once

    def put(self, item: Any) -> None:
        with self._lock:
            if item.request_id in self._forgotten:
                return  # every copy has the abort; nobody wants this
            owner = self._owner.get(item.request_id)
            if owner is None:
                owner = min(range(len(self.inboxes)), key=self.in_flight.__getitem__)
                self._owner[item.request_id] = owner
                self.in_flight[owner] += 1
            if self.is_last(item):
                self._drop(item.request_id)
        self.inboxes[owner].put(item)

    def forget(self, request_id: str) -> None:
        """An aborted or failed request: it sends no last payload, and what it still sends is dropped."""
        with self._lock:
            self._drop(request_id)
            self._forgotten[request_id] = None
            if len(self._forgotten) > self._FORGOTTEN_MEMORY:
                self._forgotten.popitem(last=False)

    def _drop(self, request_id: str) -> None:
        owner = self._owner.pop(request_id, None)
        if owner is not None:
            self.in_flight[owner] -= 1


# What stages report to the orchestrator, besides the public TextDelta / AudioChunk events.

Report = Callable[[Any], None]


class ReportQueue:
    """Stage threads -> the orchestrator's event loop, in order. One wake-up of the loop carries every report
    queued before it runs: a wake-up per text delta of a batch would take the GIL from the stage threads and
    delay every reply's first packet."""

    def __init__(self) -> None:
        self._reports: deque[Any] = deque()  # appends are thread-safe; one deque keeps the order
        self._lock = threading.Lock()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: Callable[[Any], None] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop, handle: Callable[[Any], None]) -> None:
        self._loop, self._handle = loop, handle

    def put(self, item: Any) -> None:
        assert self._loop is not None, f"a stage reported before the engine started: {item!r}"
        self._reports.append(item)
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False  # before draining: a report queued from now on schedules anew
        assert self._handle is not None
        while self._reports:
            self._handle(self._reports.popleft())


@dataclass(frozen=True, slots=True)
class ThinkerFinished:
    request_id: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # of prompt_tokens, those a cached prefix held (not prefilled)


# where a spoken reply's way to its first packet stands, in the order it passes them: the Thinker takes it from its
# queue, samples its first token; the Talker has prefilled its prompt and header (its frames come next); Code2Wav
# begins its first chunk
Milestone = Literal["thinker", "first_token", "talker", "code2wav"]


@dataclass(frozen=True, slots=True)
class Reached:
    """A stage passed one of a reply's milestones at `at` (time.perf_counter(), the orchestrator's clock)."""

    request_id: str
    milestone: Milestone
    at: float


@dataclass(frozen=True, slots=True)
class AudioFinished:
    """Code2Wav sent a reply's last audio; `codec_frames` is how many frames the Talker made."""

    request_id: str
    codec_frames: int


@dataclass(frozen=True, slots=True)
class StageFailed:
    request_id: str
    reason: str
