"""The pictures `--image` sends with chat requests and realtime turns: a PNG/JPEG/WebP file as it is, or synthetic
camera-like frames of a given size (`WxH`), read or drawn once per run, before any clock starts, as data URLs.

Synthetic frames are all distinct, as a camera's are and as different users' pictures are: the same room, each
frame its own sensor noise. A server that knows a picture it has seen (a prefix cache keyed by the pixels) would
find every repeated one in its cache, and a run that sent one picture to every request measured that, not a new
picture's cost. Up to `MAX_FRAMES` are drawn a run; past that the run's pictures repeat in order."""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, UnidentifiedImageError

_SIZE = re.compile(r"(\d+)x(\d+)")
# One side of a synthetic picture: 4096 x 4096 is the server's default pixel limit, and drawing one takes
# about 200 MiB of float32 here; a larger picture can still be given as a file.
MAX_SIDE_PX = 4096
FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}  # Pillow's name -> the data URL's image/<subtype>
JPEG_QUALITY = 85  # a phone or webcam JPEG's usual quality
_SEED = 0  # the same pictures for the same size, run after run
# distinct frames a run draws at most (~25 ms and ~190 KiB of base64 each at 1280x720)
MAX_FRAMES = 256


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What a result records of the picture it sent (its JSON's `image`)."""

    spec: str  # --image as given: a path, or WxH for a synthetic picture
    width: int
    height: int
    format: str  # jpeg, png or webp
    size_bytes: int  # the first picture's encoded file, before base64
    distinct: int = 1  # pictures drawn: the run's n-th picture sent is picture n % distinct (a file: 1)


@dataclass(frozen=True, slots=True)
class BenchImage:
    info: ImageInfo
    data_urls: tuple[str, ...]  # data:image/<format>;base64,...: built once, each sent as it is


def synthetic_size(spec: str) -> tuple[int, int] | None:
    """(width, height) when `spec` is `WxH`, else None (it names a file)."""
    if not (match := _SIZE.fullmatch(spec.strip().lower())):
        return None
    return int(match[1]), int(match[2])


def check_image_spec(spec: str) -> str:
    """`spec` as given, once it is a WxH in range or a PNG/JPEG/WebP file; ValueError saying what is wrong."""
    if (size := synthetic_size(spec)) is not None:
        if not all(1 <= side <= MAX_SIDE_PX for side in size):
            raise ValueError(f"{spec!r}: width and height must be 1-{MAX_SIDE_PX} px")
        return spec
    path = Path(spec)
    if path.is_file():
        _file_format(path)
        return spec
    if re.fullmatch(r"[\d\s*xX,]+", spec):  # meant as a size, but not WxH
        raise ValueError(f"{spec!r}: a size is WIDTHxHEIGHT, e.g. 1280x720")
    raise ValueError(f"{spec!r}: no such file (expected a PNG, JPEG or WebP file, or WxH such as 1280x720)")


def _file_format(path: Path) -> tuple[str, int, int]:
    """(format, width, height) from the file's header; ValueError unless it is a PNG, JPEG or WebP."""
    try:
        with Image.open(path) as img:
            kind, (width, height) = img.format, img.size
    except (OSError, UnidentifiedImageError) as exc:
        raise ValueError(f"{path}: not an image Pillow reads ({exc})") from exc
    if kind not in FORMATS:
        raise ValueError(f"{path}: a {kind} image; --image takes PNG, JPEG or WebP")
    return FORMATS[kind], width, height


def synthetic_picture(width: int, height: int) -> bytes:
    """A camera-like frame as a JPEG (the first of `synthetic_frames`); the same bytes for the same size."""
    return synthetic_frames(width, height, 1)[0]


def synthetic_frames(width: int, height: int, count: int) -> list[bytes]:
    """`count` camera-like frames of one scene as JPEGs: a lit room's gradients, some objects in it, and sensor
    noise, so that each compresses as a real frame would rather than to nothing. Each frame has its own noise
    (one field of it, read from another offset), so no two frames have the same pixels. The same bytes for the
    same size and count."""
    rng = np.random.default_rng(_SEED)
    # float32 [H, W, 3]: a wall fading into a floor, light falling off from one side
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    wall, floor = rng.uniform(90, 230, 3).astype(np.float32), rng.uniform(30, 140, 3).astype(np.float32)
    pixels = wall * (1 - y) + floor * y + 40 * (0.5 - x)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(16):  # objects in the room: boxes and round things of a tenth to a third of the frame
        cx, cy = rng.uniform(0, 1, 2)
        half_w, half_h = rng.uniform(0.05, 0.17, 2)
        box = ((cx - half_w) * width, (cy - half_h) * height, (cx + half_w) * width, (cy + half_h) * height)
        colour = tuple(int(c) for c in rng.integers(20, 236, 3))
        if rng.random() < 0.5:
            draw.rectangle(box, fill=colour, outline=(20, 20, 20), width=max(1, width // 400))
        else:
            draw.ellipse(box, fill=colour)
    scene = np.asarray(img, dtype=np.float32).reshape(-1)
    # one noise field: frame f reads it f pixels on, so each pixel's noise differs from frame to frame
    noise = rng.standard_normal(scene.size + count * 3, dtype=np.float32) * 6
    frames = []
    for frame in range(count):
        noisy = scene + noise[frame * 3: frame * 3 + scene.size]
        out = io.BytesIO()
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8).reshape(height, width, 3)).save(
            out, format="JPEG", quality=JPEG_QUALITY)
        frames.append(out.getvalue())
    return frames


def load_image(spec: str, count: int = 1) -> BenchImage:
    """The pictures `spec` names (see check_image_spec), as they are sent: `count` distinct synthetic frames (at
    most MAX_FRAMES), or the file; ValueError if it cannot be read."""
    check_image_spec(spec)
    if (size := synthetic_size(spec)) is not None:
        pictures, (kind, width, height) = synthetic_frames(*size, max(1, min(count, MAX_FRAMES))), ("jpeg", *size)
    else:
        try:
            pictures = [Path(spec).read_bytes()]
        except OSError as exc:
            raise ValueError(f"{spec!r}: {exc}") from exc
        kind, width, height = _file_format(Path(spec))
    urls = tuple(f"data:image/{kind};base64,{base64.b64encode(data).decode()}" for data in pictures)
    return BenchImage(ImageInfo(spec, width, height, kind, len(pictures[0]), len(urls)), urls)
