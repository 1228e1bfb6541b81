"""What one sweep does (`BenchConfig`; `VoiceConfig` for the realtime one), and checking sweep settings that come
from a ladder file."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bench.image import check_image_spec
from bench.video import check_video_spec


class BenchError(RuntimeError):
    """Setup problem that makes a run meaningless (no model to target, a bad ladder file)."""


# The DESIGN.md section 7 workload: concurrency 1/16/32/64, replies of 40 text tokens (the server's
# profile fixes the codec frames and, with random weights, ignores EOS).
@dataclass
class BenchConfig:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: first id from GET /v1/models
    concurrency: list[int] = field(default_factory=lambda: [1, 16, 32, 64])
    prompt_tokens: list[int] = field(default_factory=lambda: [16])  # approximate, in words
    num_requests: int | None = None  # None: max(2*C, 4) per level
    warmup: int = 1  # unrecorded requests before each level
    max_tokens: int = 40
    modalities: list[str] = field(default_factory=lambda: ["text", "audio"])
    voice: str | None = None  # None: the server's default voice
    seed: int | None = 0  # fixed seed keeps outputs identical across runs being compared
    label: str = "bench"
    out_dir: Path = Path("benchmarks/local")
    timeout: float = 300.0
    # processes the level's workers are spread over: with one, all C workers share one Python event
    # loop, and a burst of C sends queues on it (the client's own time, not the server's)
    client_processes: int = 1
    # a WAV file, or a folder of them: each request's user message carries one as `input_audio` after its text
    input_audio: Path | None = None
    # a PNG/JPEG/WebP file, or WxH for a synthetic camera-like JPEG: each request's user message carries it as
    # an `image_url` part before its text (bench/image.py)
    image: str | None = None
    # an MP4/WebM file, or WxHxS for a synthetic clip: each request's user message carries it as a `video_url`
    # part before its text, after the picture (bench/video.py)
    video: str | None = None
    # 0: every worker sends its first request at once, and replies of one length keep them in waves;
    # S: each worker's first send waits a random [0, S) s, and the closed loop keeps those phases
    # (steady arrivals, as independent users make them)
    spread_s: float = 0.0
    argv: list[str] = field(default_factory=list)  # exact command line, stored verbatim
    show_progress: bool = True

    def levels(self) -> list[tuple[int, int]]:
        """(prompt words, concurrency) pairs in run order: each is one level with its own warm-up."""
        return [(p, c) for p in self.prompt_tokens for c in self.concurrency]


DEFAULT_QUESTIONS = Path("benchmarks/voice")
VOICE_MODES = ("commit", "vad", "server")
OUTPUT_FORMATS = ("pcm16", "opus")


# DESIGN.md section 7's spoken workload: recorded questions in conversations of several turns.
@dataclass
class VoiceConfig:
    """What one realtime run does: at each level, C sessions at a time, each a conversation of `turns` questions."""

    url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: first id from GET /v1/models
    concurrency: list[int] = field(default_factory=lambda: [1, 16, 64])
    turns: int = 6
    # commit: the client appends the question, then commits and asks for a response; vad: it streams the
    # question and then silence, and the server's VAD ends the turn and answers on its own; server: the same on
    # the server's default turn detection (the session's turn_detection left as it is)
    turn_mode: list[str] = field(default_factory=lambda: ["commit"])
    output_format: list[str] = field(default_factory=lambda: ["pcm16"])  # pcm16 deltas, or binary Opus packets
    num_sessions: int | None = None  # None: C per level, one conversation per worker
    warmup: int = 1  # unrecorded one-turn sessions before each level
    max_tokens: int = 40  # the session's max_output_tokens: text tokens per reply
    voice: str | None = None  # None: the server's default voice
    questions: Path = DEFAULT_QUESTIONS  # 16-bit PCM WAVs; turn t of session s asks question (s + t) % count
    chunk_ms: int = 40  # audio per input_audio_buffer.append, as the browser demo sends
    input_speed: float = 1.0  # 1: a user speaks and listens in real time; 4: four times faster, both
    # each worker's first conversation starts a random 0-S s late, so that conversations do not speak (and cut
    # their histories) in step
    spread_s: float = 0.0
    # before each turn after its first, the user pauses a random 0-S s (at `input_speed`, as speaking and listening):
    # conversations whose questions and replies last alike otherwise fall into step, through the steps the server
    # shares among them, until every conversation asks at once
    think_s: float = 0.0
    # > 0: a level's conversations start no turn this many seconds after the level began (the turns under way end):
    # a run too long for the time at hand still leaves its result, with the turns it did not start counted
    time_limit_s: float = 0.0
    # the session's `truncation`: None leaves the server's "auto"; R asks for {"type": "retention_ratio", R}, which
    # keeps R of the room at a cut (a lower R cuts less often, so fewer turns prefill their history again)
    retention_ratio: float | None = None
    # as BenchConfig.image: a turn that carries it sends it as an `input_image` user item before its question,
    # as a camera would send a frame; turn t carries it when t % image_every == 0
    image: str | None = None
    image_every: int = 1
    label: str = "voice"
    out_dir: Path = Path("benchmarks/local")
    timeout: float = 300.0  # per turn
    client_processes: int = 1
    argv: list[str] = field(default_factory=list)
    show_progress: bool = True

    def __post_init__(self) -> None:
        if unknown := set(self.turn_mode) - set(VOICE_MODES):
            raise BenchError(f"turn_mode: unknown {sorted(unknown)} (expected {', '.join(VOICE_MODES)})")
        if unknown := set(self.output_format) - set(OUTPUT_FORMATS):
            raise BenchError(f"output_format: unknown {sorted(unknown)} (expected {', '.join(OUTPUT_FORMATS)})")
        if (self.turns < 1 or self.chunk_ms < 10 or self.input_speed <= 0 or self.spread_s < 0 or self.think_s < 0
                or self.time_limit_s < 0):
            raise BenchError(f"need turns >= 1, chunk_ms >= 10, input_speed > 0, spread_s >= 0, think_s >= 0, "
                             f"time_limit_s >= 0; got {self.turns}, {self.chunk_ms}, {self.input_speed}, {self.spread_s}, "
                             f"{self.think_s}, {self.time_limit_s}")
        if self.image_every < 1:
            raise BenchError(f"image_every: must be >= 1, got {self.image_every}")
        if self.retention_ratio is not None and not 0.0 <= self.retention_ratio <= 1.0:
            raise BenchError(f"retention_ratio: must be within 0-1, got {self.retention_ratio}")
        if self.image_every > 1 and self.image is None:
            raise BenchError("image_every: says which turns send the image, but there is none (--image)")

    def levels(self) -> list[tuple[str, str, int]]:
        """(mode, output format, concurrency) in run order: each is one level with its own warm-up."""
        return [(m, f, c) for m in self.turn_mode for f in self.output_format for c in self.concurrency]


# Sweep settings a ladder file (top-level `bench:` or a row's `bench:`) may set, with their checks.
def _positive_ints(value: Any) -> list[int]:
    values = [value] if isinstance(value, int) else value
    if (not isinstance(values, list) or not values
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values)):
        raise ValueError("must be a positive integer or a non-empty list of them")
    return list(values)


def _int_at_least(lo: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"must be an integer >= {lo}")
        return value
    return check


def _modalities(value: Any) -> list[str]:
    if value not in (["text"], ["text", "audio"], ["audio", "text"]):
        raise ValueError("must be [text] or [text, audio]")
    return list(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("must be a positive number of seconds")
    return float(value)


def _seconds_or_zero(value: Any) -> float:
    return 0.0 if value == 0 else _seconds(value)


def _seed(value: Any) -> int | None:
    return None if value is None else _int_at_least(0)(value)


def _image(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a PNG/JPEG/WebP path or WxH such as 1280x720")
    return check_image_spec(value)


def _video(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be an MP4/WebM path or WxHxS such as 640x360x4")
    return check_video_spec(value)


SWEEP_KEYS = {
    "concurrency": _positive_ints,
    "prompt_tokens": _positive_ints,
    "num_requests": _int_at_least(1),
    "warmup": _int_at_least(0),
    "max_tokens": _int_at_least(1),
    "modalities": _modalities,
    "voice": str,
    "seed": _seed,
    "timeout": _seconds,
    "client_processes": _int_at_least(1),
    "input_audio": Path,
    "image": _image,
    "video": _video,
    "spread_s": _seconds_or_zero,
}
assert set(SWEEP_KEYS) <= {f.name for f in fields(BenchConfig)}


def sweep_overrides(raw: Any, where: str) -> dict[str, Any]:
    """Checked sweep settings from a ladder file; errors name the key's path."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BenchError(f"{where}: must be a mapping, got {type(raw).__name__}")
    out = {}
    for key, value in raw.items():
        if key not in SWEEP_KEYS:
            raise BenchError(f"{where}.{key}: unknown key (expected one of {', '.join(SWEEP_KEYS)})")
        try:
            out[key] = SWEEP_KEYS[key](value)
        except (ValueError, TypeError) as exc:
            raise BenchError(f"{where}.{key}: {exc}, got {value!r}") from exc
    return out


def with_overrides(config: BenchConfig, *layers: dict[str, Any]) -> BenchConfig:
    """Later layers win: e.g. the ladder file's defaults, then the command line, then one row."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    return replace(config, **merged)
