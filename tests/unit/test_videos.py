"""Input videos at the edge (voice_gateway/media/videos.py): MP4 and WebM data URLs to frames sampled at the limits'
rate; what the header claims is refused before decoding; bad files are errors with a code, never a crash."""

from __future__ import annotations

import asyncio
import base64
import io

import av
import numpy as np
import pytest

from voice_gateway.media.images import ImageError
from voice_gateway.media.videos import VideoLimits, decode_video, video_from_url


def encoded(seconds: float = 3.0, rate: int = 10, size: tuple[int, int] = (64, 48), fmt: str = "mp4",
            codec: str = "h264", sound: str | None = None, tone_hz: float = 440.0) -> bytes:
    """A clip whose frame k is grey level 8k (so which frames were sampled can be read back); with a tone of
    `tone_hz` at 48 kHz in a `sound` stream (a codec name) when asked."""
    width, height = size
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        audio = None if sound is None else container.add_stream(sound, rate=48_000, layout="mono")
        for k in range(int(seconds * rate)):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 8 * k % 256, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio is not None:
            tone = (0.5 * np.sin(2 * np.pi * tone_hz * np.arange(int(seconds * 48_000)) / 48_000)).astype(np.float32)
            step = audio.codec_context.frame_size or 960
            for at in range(0, tone.size - step + 1, step):
                chunk = av.AudioFrame.from_ndarray(tone[None, at : at + step], format="fltp", layout="mono")
                chunk.sample_rate, chunk.pts = 48_000, at
                for packet in audio.encode(chunk):
                    container.mux(packet)
            for packet in audio.encode():
                container.mux(packet)
    return out.getvalue()


def _peak_hz(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * 16_000 / samples.size)


def data_url(raw: bytes, media_type: str = "video/mp4") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


@pytest.mark.parametrize("fmt, codec", [("mp4", "h264"), ("webm", "libvpx-vp9")])
def test_frames_are_sampled_at_the_limits_rate(fmt: str, codec: str) -> None:
    video = decode_video(encoded(fmt=fmt, codec=codec), VideoLimits(fps=2.0))
    assert video.fps == 2.0 and video.frames.shape == (6, 48, 64, 3) and video.frames.dtype == np.uint8
    # 10 frames a second, one kept each 0.5 s: frames 0, 5, 10, ... (grey 0, 40, 80, ...; lossy, so roughly)
    greys = video.frames.reshape(6, -1).mean(axis=1)
    np.testing.assert_allclose(greys, [0, 40, 80, 120, 160, 200], atol=12)


def test_at_most_max_frames_are_kept() -> None:
    video = decode_video(encoded(seconds=6.0), VideoLimits(fps=2.0, max_frames=4))
    assert len(video.frames) == 4


@pytest.mark.parametrize("raw, limits, code", [
    (b"not a video at all" * 10, VideoLimits(), "invalid_video"),
    (encoded()[:600], VideoLimits(), "invalid_video"),  # truncated
    (encoded(size=(320, 240)), VideoLimits(max_frame_pixels=160 * 120), "image_too_large"),
    (encoded(seconds=4.0), VideoLimits(max_seconds=2.0), "image_too_large"),
])
def test_bad_videos_are_refused_with_a_code(raw: bytes, limits: VideoLimits, code: str) -> None:
    with pytest.raises(ImageError) as refused:
        decode_video(raw, limits)
    assert refused.value.code == code, refused.value


@pytest.mark.parametrize("url, code", [
    ("https://example.com/clip.mp4", "invalid_image_url"),
    ("data:image/png;base64,AAAA", "invalid_image_url"),
    ("data:video/mp4;base64,@@@", "invalid_image_url"),
    (data_url(b"x" * 4096), "image_too_large"),
])
def test_bad_video_urls_are_refused(url: str, code: str) -> None:
    with pytest.raises(ImageError) as refused:
        asyncio.run(video_from_url(url, VideoLimits(max_video_bytes=2048)))
    assert refused.value.code == code, refused.value


def test_a_data_url_decodes() -> None:
    video = asyncio.run(video_from_url(data_url(encoded(fmt="webm", codec="libvpx"), "video/webm"), VideoLimits()))
    assert video.frames.shape[0] == 6


@pytest.mark.parametrize("fmt, codec, sound", [("mp4", "h264", "aac"), ("webm", "libvpx-vp9", "libopus")])
def test_the_sound_comes_over_the_frames_time_when_asked(fmt: str, codec: str, sound: str) -> None:
    raw = encoded(seconds=3.0, fmt=fmt, codec=codec, sound=sound)
    assert decode_video(raw, VideoLimits(fps=2.0)).audio is None
    video = decode_video(raw, VideoLimits(fps=2.0), with_sound=True)
    assert video.audio is not None and video.audio.dtype == np.float32
    assert video.audio.size == len(video.frames) / 2.0 * 16_000  # 6 frames: 3 s
    assert abs(_peak_hz(video.audio) - 440) < 5 and 0.2 < np.abs(video.audio).max() <= 1.0
    # frames stop at max_frames, and the sound with them
    short = decode_video(raw, VideoLimits(fps=2.0, max_frames=2), with_sound=True)
    assert short.audio is not None and short.audio.size == 16_000


def test_asking_for_the_sound_of_a_silent_video_is_an_error() -> None:
    with pytest.raises(ImageError, match="no sound") as e:
        decode_video(encoded(), VideoLimits(), with_sound=True)
    assert e.value.code == "invalid_video"
