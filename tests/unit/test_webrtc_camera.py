"""A WebRTC call's camera (voice_gateway/webrtc/media.py): the latest frame of its video track goes with a turn,
and none once the track has ended, unless a later track has sent one (a camera switched for a screen)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("aiortc")
from aiortc import VideoStreamTrack  # noqa: E402

from voice_gateway.webrtc.media import Camera  # noqa: E402


async def _frames(camera: Camera, count: int) -> None:
    async with asyncio.timeout(10):
        while camera.frames < count:
            await asyncio.sleep(0.01)


async def test_a_stopped_track_leaves_no_frame() -> None:
    camera, track = Camera(), VideoStreamTrack()  # aiortc's own test pattern, 640x480 at 30 frames a second
    assert camera.latest() is None
    consuming = asyncio.create_task(camera.consume(track))
    await _frames(camera, 2)
    frame = camera.latest()
    assert frame is not None and frame.shape == (480, 640, 3)
    track.stop()
    await asyncio.wait_for(consuming, 5)
    assert camera.latest() is None


class Stills(VideoStreamTrack):
    """aiortc's test pattern, one frame each time the test releases one."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Semaphore(0)

    async def recv(self):
        await self.release.acquire()
        return await super().recv()


async def test_an_ended_track_leaves_a_later_tracks_frame() -> None:
    camera, first, second = Camera(), Stills(), Stills()
    consuming = [asyncio.create_task(camera.consume(track)) for track in (first, second)]
    first.release.release()
    await _frames(camera, 1)
    second.release.release()  # the screen's frame, after the camera's
    await _frames(camera, 2)
    first.stop()
    first.release.release()
    await asyncio.wait_for(consuming[0], 5)
    assert camera.latest() is not None  # the camera's end leaves the screen's frame
    second.stop()
    second.release.release()
    await asyncio.wait_for(consuming[1], 5)
    assert camera.latest() is None
