"""The clip `--video` sends with each chat request: an MP4 or WebM file as it is, or a synthetic clip of a given
size and length (`WxHxS`), read or encoded once per run and carried as one data URL."""

from __future__ import annotations

import base64
import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

_SPEC = re.compile(r"(\d+)x(\d+)x(\d+)")
# The server's default limits: a synthetic clip stays within them; a larger one can still be given as a file.
MAX_FRAME_PIXELS = 1920 * 1080
MAX_SECONDS = 30
FRAME_RATE = 10  # frames a second of a synthetic clip: the server samples 2 a second
FORMATS = {".mp4": "mp4", ".webm": "webm"}  # file suffix -> the data URL's video/<subtype> and PyAV's format name
_SHAPES = 6
_SEED = 0  # the same clip for the same spec, run after run


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """What a result records of the clip it sent (its JSON's `video`)."""

    spec: str  # --video as given: a path, or WxHxS for a synthetic clip
    width: int
    height: int
    seconds: float | None  # from the container's header; None when it states none
    format: str  # mp4 or webm
    size_bytes: int  # the encoded file, before base64


@dataclass(frozen=True, slots=True)
class BenchVideo:
    info: VideoInfo
    data_url: str  # data:video/<format>;base64,...: built once, sent as it is


def synthetic_spec(spec: str) -> tuple[int, int, int] | None:
    """(width, height, seconds) when `spec` is `WxHxS`, else None (it names a file)."""
    if not (match := _SPEC.fullmatch(spec.strip().lower())):
        return None
    return int(match[1]), int(match[2]), int(match[3])


def check_video_spec(spec: str) -> str:
    """`spec` as given, once it is a WxHxS in range or an MP4/WebM file; ValueError saying what is wrong."""
    if (size := synthetic_spec(spec)) is not None:
        width, height, seconds = size
        if width < 2 or height < 2 or width % 2 or height % 2:
            raise ValueError(f"{spec!r}: width and height must be even and at least 2 (H.264 4:2:0 halves both)")
        if width * height > MAX_FRAME_PIXELS:
            raise ValueError(f"{spec!r}: at most 1920x1080 = {MAX_FRAME_PIXELS} pixels a frame")
        if not 1 <= seconds <= MAX_SECONDS:
            raise ValueError(f"{spec!r}: 1-{MAX_SECONDS} seconds")
        return spec
    path = Path(spec)
    if path.is_file():
        _probe(path)
        return spec
    if re.fullmatch(r"[\d\s*xX,.]+", spec):  # meant as a size, but not WxHxS
        raise ValueError(f"{spec!r}: a synthetic clip is WIDTHxHEIGHTxSECONDS, e.g. 640x360x4")
    raise ValueError(f"{spec!r}: no such file (expected an MP4 or WebM file, or WxHxS such as 640x360x4)")


def _probe(path: Path) -> tuple[str, int, int, float | None]:
    """(format, width, height, seconds) from the file's header; ValueError unless it is an MP4 or WebM video."""
    if (kind := FORMATS.get(path.suffix.lower())) is None:
        raise ValueError(f"{path}: --video takes an .mp4 or .webm file, not {path.suffix or 'one without a suffix'}")
    try:
        with av.open(str(path), mode="r") as container:
            if kind not in container.format.name.split(","):
                raise ValueError(f"{path}: holds {container.format.name}, not {kind}")
            if not container.streams.video:
                raise ValueError(f"{path}: has no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            seconds = None if container.duration is None else container.duration / av.time_base
    except av.FFmpegError as exc:
        raise ValueError(f"{path}: not a video PyAV reads ({exc})") from exc
    return kind, width, height, seconds


# A ladder measures each row with its own sweep: the same spec is encoded once, not once a row.
@functools.lru_cache(maxsize=4)
def synthetic_clip(width: int, height: int, seconds: int) -> bytes:
    """H.264 in MP4, FRAME_RATE frames a second: coloured boxes and ellipses gliding over a gradient and bouncing
    off its edges, so that sampled frames differ as a camera's would. The same bytes for the same arguments."""
    rng = np.random.default_rng(_SEED)
    # float32 [H, W, 3]: one colour at the top left fading into another at the bottom right
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    top, bottom = rng.uniform(40, 230, (2, 3)).astype(np.float32)
    background = Image.fromarray(np.clip(top + (bottom - top) * (x + y) / 2, 0, 255).astype(np.uint8))
    start = rng.uniform(0, 1, (_SHAPES, 2))  # centres, as fractions of width and height
    velocity = rng.uniform(-0.4, 0.4, (_SHAPES, 2))  # frame widths / heights a second
    half = rng.uniform(0.05, 0.15, (_SHAPES, 2))
    colours = [tuple(int(c) for c in rgb) for rgb in rng.integers(0, 256, (_SHAPES, 3))]
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        # x264 tuned as a live camera's encoder (zerolatency: no B-frames, no lookahead). With both, this x264
        # encodes a clip differently once the process has encoded another size, and the bytes would vary.
        stream = container.add_stream("h264", rate=FRAME_RATE, options={"tune": "zerolatency"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # one encoder thread: x264 writes its thread count into the stream, and its output depends on it
        stream.codec_context.thread_count = 1
        for k in range(seconds * FRAME_RATE):
            centre = np.abs((start + velocity * k / FRAME_RATE + 1) % 2 - 1)  # bouncing: folded into [0, 1]
            img = background.copy()
            draw = ImageDraw.Draw(img)
            for i, ((cx, cy), (hw, hh)) in enumerate(zip(centre, half, strict=True)):
                box = ((cx - hw) * width, (cy - hh) * height, (cx + hw) * width, (cy + hh) * height)
                (draw.rectangle if i % 2 else draw.ellipse)(box, fill=colours[i])
            container.mux(stream.encode(av.VideoFrame.from_image(img)))
        container.mux(stream.encode())
    return out.getvalue()


def load_video(spec: str) -> BenchVideo:
    """The clip `spec` names (see check_video_spec), as it is sent; ValueError if it cannot be read."""
    check_video_spec(spec)
    info: tuple[str, int, int, float | None]
    if (size := synthetic_spec(spec)) is not None:
        width, height, seconds = size
        data, info = synthetic_clip(*size), ("mp4", width, height, float(seconds))
    else:
        try:
            data = Path(spec).read_bytes()
        except OSError as exc:
            raise ValueError(f"{spec!r}: {exc}") from exc
        info = _probe(Path(spec))
    kind, width, height, duration = info
    url = f"data:video/{kind};base64,{base64.b64encode(data).decode()}"
    return BenchVideo(VideoInfo(spec, width, height, duration, kind, len(data)), url)
