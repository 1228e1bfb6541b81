"""Input videos at the edge (chat's `video_url` parts, vLLM's extension): `data:video/...` URLs decoded with PyAV to
frames sampled at a fixed rate, within `VideoLimits`.

A stream whose frames exceed `max_frame_pixels`, or that runs past `max_seconds`, is refused from the container's
header, before any frame is decoded. Frames are sampled at `fps` (the rate the engine's positions assume) and at
most `max_frames` are kept, so memory is bounded whatever the file claims. With `with_sound` (Qwen3-Omni's
`use_audio_in_video`) its first audio stream is taken, mono at 16 kHz, over the sampled frames' time, so frames
and sound stay aligned when `max_frames` ends the video early."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
from dataclasses import dataclass

import av
import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ, VideoPart
from voice_gateway.media.images import IMAGE_TOO_LARGE, INVALID_IMAGE_URL, ImageError

INVALID_VIDEO = "invalid_video"
_DATA_URL = "data:"


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_video_bytes: int = 16 * 1024 * 1024  # one encoded video (a chat body holds at most 32 MiB of base64)
    max_frame_pixels: int = 1920 * 1080  # decoded width x height of one frame
    max_seconds: float = 30.0  # the stream's duration, from its header or counted while decoding
    fps: float = 2.0  # frames sampled a second
    max_frames: int = 32  # sampled frames kept: 16 s at 2 a second

    def __post_init__(self) -> None:
        if self.max_video_bytes < 1024 or self.max_frame_pixels < 64 * 64 or self.max_seconds <= 0 \
                or self.fps <= 0 or self.max_frames < 2:
            raise ValueError(f"impossible video limits: {self}")


async def video_from_url(url: str, limits: VideoLimits, *, with_sound: bool = False) -> VideoPart:
    """The video a `data:video/...;base64,` URL holds, its frames sampled (decoded in a thread), and its sound when
    `with_sound`. `ImageError` (codes as for images, and `invalid_video`) when it cannot be."""
    if url[: len(_DATA_URL)].lower() != _DATA_URL:
        raise ImageError(INVALID_IMAGE_URL, "a video URL is a data:video/...;base64 URL (this server fetches none)")
    header, comma, data = url.partition(",")
    media_type, *params = header[len(_DATA_URL):].split(";")
    if not comma or not media_type.strip().lower().startswith("video/") or "base64" not in (p.lower() for p in params):
        raise ImageError(INVALID_IMAGE_URL, "a video URL is a data:video/...;base64,... URL (e.g. video/mp4)")
    if len(data) > (limits.max_video_bytes + 2) // 3 * 4:
        raise ImageError(IMAGE_TOO_LARGE, f"the video holds more than {limits.max_video_bytes} bytes; at most "
                         f"{limits.max_video_bytes} are taken")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(INVALID_IMAGE_URL, f"the video's data is not valid base64: {e}") from None
    return await asyncio.to_thread(decode_video, raw, limits, with_sound=with_sound)


def decode_video(raw: bytes, limits: VideoLimits, *, with_sound: bool = False) -> VideoPart:
    """Frames [n, height, width, 3] uint8 of the first video stream at `fps`; with its sound when `with_sound`."""
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.video:
                raise ImageError(INVALID_VIDEO, "the file has no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width * height > limits.max_frame_pixels:
                raise ImageError(IMAGE_TOO_LARGE, f"the video's frames are {width} x {height} pixels; at most "
                                 f"{limits.max_frame_pixels} pixels (width x height) are taken")
            if stream.duration is not None and stream.time_base is not None \
                    and float(stream.duration * stream.time_base) > limits.max_seconds:
                raise ImageError(IMAGE_TOO_LARGE, f"the video runs {float(stream.duration * stream.time_base):.1f} s; "
                                 f"at most {limits.max_seconds:g} s are taken")
            frames = _sample(container, stream, limits)
    except ImageError:
        raise
    except (av.FFmpegError, ValueError, EOFError) as e:  # PyAV's ways of saying the file is bad or truncated
        raise ImageError(INVALID_VIDEO, f"the video does not decode: {type(e).__name__}: {e}") from None
    if len(frames) < 1:
        raise ImageError(INVALID_VIDEO, "the video has no frames")
    if len({f.shape for f in frames}) > 1:
        raise ImageError(INVALID_VIDEO, "the video's frames change size")
    sound = _sound(raw, len(frames) / limits.fps) if with_sound else None
    return VideoPart(np.stack(frames), limits.fps, sound)


def _sound(raw: bytes, seconds: float) -> np.ndarray:
    """The first audio stream's first `seconds`, mono float32 at 16 kHz (silence after it ends early)."""
    wanted = round(seconds * INPUT_SAMPLE_RATE_HZ)
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.audio:
                raise ImageError(INVALID_VIDEO, "the video has no sound, and its sound was asked for "
                                 "(use_audio_in_video)")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=INPUT_SAMPLE_RATE_HZ)
            pieces, have = [], 0
            for frame in container.decode(container.streams.audio[0]):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    have += pieces[-1].size
                if have >= wanted:
                    break
            else:
                pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    except ImageError:
        raise
    except (av.FFmpegError, ValueError, EOFError) as e:
        raise ImageError(INVALID_VIDEO, f"the video's sound does not decode: {type(e).__name__}: {e}") from None
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return np.pad(samples[:wanted], (0, max(0, wanted - samples.size))).astype(np.float32)


def _sample(container: av.container.InputContainer, stream: av.video.stream.VideoStream,
            limits: VideoLimits) -> list[np.ndarray]:
    frames: list[np.ndarray] = []
    next_at = 0.0
    for frame in container.decode(stream):
        at = frame.time if frame.time is not None else next_at
        if at > limits.max_seconds:
            raise ImageError(IMAGE_TOO_LARGE, f"the video runs past {limits.max_seconds:g} s, the most taken")
        if frame.width * frame.height > limits.max_frame_pixels:
            raise ImageError(IMAGE_TOO_LARGE, f"a frame is {frame.width} x {frame.height} pixels; at most "
                             f"{limits.max_frame_pixels} are taken")
        if at + 1e-6 < next_at:
            continue
        frames.append(frame.to_ndarray(format="rgb24"))
        next_at += 1 / limits.fps
        if len(frames) == limits.max_frames:
            break
    return frames
