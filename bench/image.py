"""The picture `--image` sends with each chat request or realtime turn: a PNG/JPEG/WebP file as it is, or a
synthetic camera-like frame of a given size (`WxH`), read or drawn once per run and carried as one data URL."""

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
_SEED = 0  # the same picture for the same size, run after run


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What a result records of the picture it sent (its JSON's `image`)."""

    spec: str  # --image as given: a path, or WxH for a synthetic picture
    width: int
    height: int
    format: str  # jpeg, png or webp
    size_bytes: int  # the encoded file, before base64


@dataclass(frozen=True, slots=True)
class BenchImage:
    info: ImageInfo
    data_url: str  # data:image/<format>;base64,...: built once, sent as it is


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
    """A camera-like frame as a JPEG: a lit room's gradients, some objects in it, and sensor noise, so that it
    compresses as a real frame would rather than to nothing. The same bytes for the same size."""
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
    noisy = np.asarray(img, dtype=np.float32) + rng.standard_normal((height, width, 3), dtype=np.float32) * 6
    out = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def load_image(spec: str) -> BenchImage:
    """The picture `spec` names (see check_image_spec), as it is sent; ValueError if it cannot be read."""
    check_image_spec(spec)
    if (size := synthetic_size(spec)) is not None:
        data, (kind, width, height) = synthetic_picture(*size), ("jpeg", *size)
    else:
        try:
            data = Path(spec).read_bytes()
        except OSError as exc:
            raise ValueError(f"{spec!r}: {exc}") from exc
        kind, width, height = _file_format(Path(spec))
    url = f"data:image/{kind};base64,{base64.b64encode(data).decode()}"
    return BenchImage(ImageInfo(spec, width, height, kind, len(data)), url)
