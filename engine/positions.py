"""M-RoPE's positions: a prompt's three rows (t, h, w) where it holds images or videos, and what follows them.

Text and audio advance the three rows together. An image's placeholders take (start, start + row, start + column)
over its merged grid (a video's t also steps with its frames' time), and what follows starts after the largest
(transformers' `get_rope_index`): such a prompt takes fewer positions than tokens, and its reply continues from
there (`Rope`). Positions depend only on what comes before them, so a kept prefix holds the same positions in
every turn. A video with its sound interleaves its frames' and sound's placeholders by time, as Qwen3-Omni's
processor does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Grid:
    """An image's or video's patch grid (t, h, w), its time step and the audio tokens interleaved with it."""

    thw: tuple[int, int, int]
    time_step: int = 0
    audio: int = 0


def _interleaved(grid: Grid, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """A span's (t, h, w) rows from 0 [3, n] and which of its tokens are the video's [n]: the frames' tokens at
    their pair's time and the sound's at one position each, in time order (a frame's token first at a tie)."""
    t, h, w = grid.thw
    gh, gw = h // merge, w // merge
    video = np.stack([np.broadcast_to(np.arange(t)[:, None, None] * grid.time_step, (t, gh, gw)),
                      np.broadcast_to(np.arange(gh)[None, :, None], (t, gh, gw)),
                      np.broadcast_to(np.arange(gw)[None, None, :], (t, gh, gw))]).reshape(3, -1)
    if not grid.audio:
        return video, np.ones(video.shape[1], dtype=bool)
    rows = np.concatenate([video, np.broadcast_to(np.arange(grid.audio), (3, grid.audio))], axis=1)
    is_video = np.arange(rows.shape[1]) < video.shape[1]
    order = np.lexsort((~is_video, rows[0]))  # stable: each kind keeps its own order
    return rows[:, order], is_video[order]


def image_positions(start: int, grid: Grid, merge: int) -> np.ndarray:
    """[3, tokens]: the (t, h, w) rows of an image's (or video's) placeholders that begin at position `start`."""
    return _interleaved(grid, merge)[0] + start


def video_layout(grid: Grid, merge: int) -> np.ndarray:
    """[tokens]: which of a video-with-sound's placeholders are the frames' (the rest are the sound's)."""
    return _interleaved(grid, merge)[1]


def mrope_positions(length: int, image_spans: list[tuple[int, int]], grids: list[Grid], merge: int) -> np.ndarray:
    """[3, length]: M-RoPE's rows for a prompt whose images and videos (of these grids) lie at `image_spans`."""
    parts, at, next_pos = [], 0, 0
    for (a, b), grid in zip(image_spans, grids, strict=True):
        parts.append(np.broadcast_to(np.arange(next_pos, next_pos + a - at), (3, a - at)))
        next_pos += a - at
        rows = image_positions(next_pos, grid, merge)
        assert rows.shape[1] == b - a, (a, b, grid)
        parts.append(rows)
        next_pos, at = int(rows.max()) + 1, b
    parts.append(np.broadcast_to(np.arange(next_pos, next_pos + length - at), (3, length - at)))
    return np.concatenate(parts, axis=1)


@dataclass(frozen=True, slots=True)
class Rope:
    """A prompt's M-RoPE rows [3, L] where they are not its positions (it holds images), and what follows it: the
    reply's position p takes p + `delta` in all three rows."""

    rows: np.ndarray
    delta: int

    @classmethod
    def of(cls, rows: np.ndarray) -> Rope:
        return cls(rows, int(rows.max()) + 1 - rows.shape[1])

    def at(self, start: int, n: int) -> np.ndarray:
        """[3, n]: the rows of positions [start, start + n), a piece of the prompt or what follows it."""
        if start < self.rows.shape[1]:
            assert start + n <= self.rows.shape[1], (start, n, self.rows.shape)
            return self.rows[:, start : start + n]
        return np.broadcast_to(np.arange(start + self.delta, start + self.delta + n), (3, n))


def placeholder_spans(token_ids: list[int], *placeholders: int) -> list[tuple[int, int]]:
    at = np.flatnonzero(np.isin(np.asarray(token_ids), placeholders))
    if not at.size:
        return []
    breaks = np.flatnonzero(np.diff(at) > 1)
    starts = np.concatenate([[at[0]], at[breaks + 1]])
    ends = np.concatenate([at[breaks] + 1, [at[-1] + 1]])
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def media_spans(token_ids: list[int], audio: int | None, visual: tuple[int, ...]) -> tuple[list[tuple[int, int]],
                                                                                            list[tuple[int, int]]]:
    """The spans [start, end) of a prompt's clips and of its images and videos, in order. A video with its sound is
    one span in both: its frames' and sound's placeholders interleave. `audio` None: a model that takes no audio."""
    ids = np.asarray(token_ids)
    clips, images = [], []
    for a, b in placeholder_spans(token_ids, *(() if audio is None else (audio,)), *visual):
        if audio is not None and (ids[a:b] == audio).any():
            clips.append((a, b))
        if np.isin(ids[a:b], visual).any():
            images.append((a, b))
    return clips, images
