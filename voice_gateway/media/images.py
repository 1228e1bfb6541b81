"""Input images at the edge: their limits, `data:` and allow-listed http(s) URLs, and decoding to RGB pixels.

Nothing is decoded before its size is known: the byte count first, then the width and height from the
file's header (PIL opens lazily), so a small file that claims a huge canvas is refused without allocating
it. That check is ours, against `ImageLimits.max_image_pixels`, not PIL's process-wide `MAX_IMAGE_PIXELS`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
from PIL import GifImagePlugin, Image, ImageFile, ImageOps, JpegImagePlugin, PngImagePlugin, WebPImagePlugin

INVALID_IMAGE = "invalid_image"  # not a PNG, JPEG, WebP or GIF, or one that does not decode
INVALID_IMAGE_URL = "invalid_image_url"  # a URL that names no image we can read: its form, or its fetch failed
IMAGE_TOO_LARGE = "image_too_large"
IMAGE_URL_NOT_ALLOWED = "image_url_not_allowed"
TOO_MANY_IMAGES = "too_many_images"  # the callers count: a request's or an item's images
IMAGES_NOT_SUPPORTED = "images_not_supported"  # the model has no vision tower (the engine's own code for it)

_MAX_REDIRECTS = 3
_DATA_URL_PREFIX = "data:"
# PIL's own check, which a GIF's frames still meet (a frame may grow the canvas): its warning is an error
# where warnings are errors (the tests)
_PIL_BOMB = (Image.DecompressionBombError, Image.DecompressionBombWarning)
# what an error message quotes of a URL: a data URL is megabytes
_QUOTED_URL_CHARS = 64


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What the server takes of input images."""

    max_image_bytes: int = 10 * 1024 * 1024  # one encoded image, before decoding
    # Decoded width * height. 4096 x 4096 takes a 16 MP phone photo (4624 x 3472) and any 4K frame, and
    # bounds one decoded image at 48 MiB of RGB (64 MiB RGBA while converting); the engine resizes far
    # below it anyway (Qwen's vision tower sees a few hundred 32 x 32 patches).
    max_image_pixels: int = 4096 * 4096
    max_images_per_request: int = 8  # one chat request, or one realtime item
    # a realtime conversation keeps the pixels of this many images (its newest); older items keep their text
    max_images_per_session: int = 16
    # Host names whose http(s) image URLs the server fetches; empty: none, and only data URLs are taken.
    # Fetching is off by default: a URL would make the server a client of any address a caller names.
    fetch_hosts: tuple[str, ...] = ()
    fetch_timeout_s: float = 5.0  # the whole fetch: connecting, the headers and every byte of the body

    def __post_init__(self) -> None:
        if self.max_image_bytes < 1024 or self.max_image_pixels < 64 * 64 or self.fetch_timeout_s <= 0:
            raise ValueError(f"impossible image limits: {self}")
        if not 1 <= self.max_images_per_request <= self.max_images_per_session:
            raise ValueError(f"images per request ({self.max_images_per_request}) must be at least 1 and at most "
                             f"the images a session keeps ({self.max_images_per_session})")
        # one colon is a port; an IPv6 address has more
        if bad := [h for h in self.fetch_hosts if not h or h != h.strip().lower() or h.count(":") == 1
                   or any(c in h for c in "/@ ")]:
            raise ValueError(f"image fetch hosts are lowercase host names (no scheme, port or path), got {bad}")


class ImageError(Exception):
    """An image the server will not take; the message is safe to show the client, `code` names why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def decode_image(raw: bytes, limits: ImageLimits, seen_pixels: int = 0) -> np.ndarray:
    """A PNG, JPEG, WebP or GIF (its first frame) as RGB uint8 [height, width, 3], turned upright by its EXIF
    orientation, transparency laid over white. `seen_pixels`: the most the model looks at (its resize budget,
    `ModelInfo.max_image_pixels`; 0: the whole image); a JPEG larger than that decodes at the smallest of libjpeg's
    scales (1/2, 1/4, 1/8) that still holds it in the picture's shape, which the model's resize then takes down
    as it would the whole image. Blocking: callers on the event loop run it in a thread."""
    if len(raw) > limits.max_image_bytes:
        raise ImageError(IMAGE_TOO_LARGE, f"the image is {len(raw)} bytes; at most {limits.max_image_bytes} are taken")
    image = _open(raw, limits)
    try:
        if seen_pixels and isinstance(image, JpegImagePlugin.JpegImageFile):
            _draft(image, seen_pixels)
        image.load()
        _upright(image)
        return _rgb(image)
    except _PIL_BOMB as e:  # a GIF frame that outgrows its canvas, past even PIL's own bound
        raise ImageError(IMAGE_TOO_LARGE, str(e)) from None
    except Exception as e:
        # PIL reports a bad file as any of OSError (truncated), SyntaxError, ValueError, struct.error,
        # zlib.error...; and where warnings are errors (the tests), a warning of its own is one more of them
        raise ImageError(INVALID_IMAGE, f"the image does not decode: {type(e).__name__}: {e}") from None
    finally:
        image.close()


def _draft(image: JpegImagePlugin.JpegImageFile, seen_pixels: int) -> None:
    """Decode at a scale that keeps at least the size the model's resize makes (each side at most the image's
    over sqrt(its pixels / the budget), as Qwen's `smart_resize` shrinks it): a phone's photo is several times
    the pixels the model sees, and decoding them all, then resizing them all, is most of its host work."""
    width, height = image.size
    if width * height <= seen_pixels:
        return
    shrink = math.sqrt(width * height / seen_pixels)
    image.draft(None, (math.ceil(width / shrink), math.ceil(height / shrink)))


def _open(raw: bytes, limits: ImageLimits) -> ImageFile.ImageFile:
    """The image's header read, its pixels not: the plugin of the format its first bytes name, opened directly
    (`Image.open` would run PIL's global decompression-bomb check, and try every other format)."""
    if raw.startswith(b"\x89PNG\r\n\x1a\n"):
        factory: type[ImageFile.ImageFile] = PngImagePlugin.PngImageFile
    elif raw.startswith(b"\xff\xd8\xff"):
        # not through JpegImagePlugin's factory, which would read an MPO's index and warn on a bad one
        factory = JpegImagePlugin.JpegImageFile
    elif raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        width, height = struct.unpack("<HH", raw[6:10])  # the logical screen
        _check_pixels((width, height), limits)
        factory = GifImagePlugin.GifImageFile
    elif raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        # libwebp allocates the canvas when the file is opened: its size is checked from the header first
        _check_pixels(_webp_canvas(raw), limits)
        factory = WebPImagePlugin.WebPImageFile
    else:
        raise ImageError(INVALID_IMAGE, "the image is not a PNG, JPEG, WebP or GIF file")
    try:
        image = factory(io.BytesIO(raw))
    except _PIL_BOMB as e:
        raise ImageError(IMAGE_TOO_LARGE, str(e)) from None
    except Exception as e:  # as in decode_image: PIL's many ways of saying the header is bad
        raise ImageError(INVALID_IMAGE, f"the image's header does not parse: {type(e).__name__}: {e}") from None
    try:
        _check_pixels(image.size, limits)
    except ImageError:
        image.close()
        raise
    return image


def _check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
    width, height = size
    if width * height > limits.max_image_pixels:
        raise ImageError(IMAGE_TOO_LARGE, f"the image is {width} x {height} pixels; at most "
                         f"{limits.max_image_pixels} pixels (width x height) are taken")
    if width < 1 or height < 1:
        raise ImageError(INVALID_IMAGE, f"the image is {width} x {height} pixels")


def _webp_canvas(raw: bytes) -> tuple[int, int]:
    """(width, height) from a WebP's first chunk header (the WebP container spec: VP8, VP8L or VP8X)."""
    chunk = raw[12:16]
    if chunk == b"VP8 " and len(raw) >= 30 and raw[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", raw[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(raw) >= 25 and raw[20] == 0x2F:
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(raw) >= 30:
        return int.from_bytes(raw[24:27], "little") + 1, int.from_bytes(raw[27:30], "little") + 1
    raise ImageError(INVALID_IMAGE, "the WebP file has no canvas size in its header")


def _upright(image: ImageFile.ImageFile) -> None:
    """Turned as its EXIF orientation says; EXIF that does not parse leaves the pixels as stored, as viewers do."""
    try:
        ImageOps.exif_transpose(image, in_place=True)
    except Exception:  # PIL's parse errors, or (where warnings are errors) its warnings about the EXIF
        return


def _rgb(image: Image.Image) -> np.ndarray:
    if image.mode in ("I", "I;16", "I;16B", "I;16L"):
        # 16-bit greyscale: PIL's own conversion clips at 255 rather than scaling
        grey = (np.asarray(image, dtype=np.uint32) // 257).clip(0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if image.mode == "P":
        # a palette's transparency (one index or a table of alphas) is an alpha channel once expanded
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif image.mode in ("LA", "La", "PA", "RGBa") or (image.mode in ("L", "RGB") and "transparency" in image.info):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        white = Image.new("RGB", image.size, (255, 255, 255))
        white.paste(image, mask=image.getchannel("A"))
        image = white
    elif image.mode != "RGB":
        image = image.convert("RGB")  # L, 1, CMYK, YCbCr, F...
    pixels = np.asarray(image, dtype=np.uint8)
    assert pixels.ndim == 3 and pixels.shape[2] == 3, pixels.shape
    return pixels


async def image_from_url(url: str, limits: ImageLimits, seen_pixels: int = 0,
                         decoded: Callable[[float], None] | None = None) -> np.ndarray:
    """The image a `data:image/...;base64,` URL or an allow-listed http(s) URL holds, decoded in a thread
    (`seen_pixels`: as `decode_image`'s); `decoded` is told how long the request waited for the decoding."""
    if url[: len(_DATA_URL_PREFIX)].lower() == _DATA_URL_PREFIX:
        raw = _data_url_bytes(url, limits)
    elif url[:7].lower() == "http://" or url[:8].lower() == "https://":
        raw = await _fetch(url, limits)
    else:
        raise ImageError(INVALID_IMAGE_URL, f"an image URL is a data:image/...;base64 URL or an http(s) URL, got "
                         f"{_quoted(url)}")
    started = time.perf_counter()
    pixels = await asyncio.to_thread(decode_image, raw, limits, seen_pixels)
    if decoded is not None:
        decoded(time.perf_counter() - started)
    return pixels


def _data_url_bytes(url: str, limits: ImageLimits) -> bytes:
    header, comma, data = url.partition(",")
    if not comma:
        raise ImageError(INVALID_IMAGE_URL, "a data URL needs a ',' before its data")
    media_type, *params = header[len(_DATA_URL_PREFIX):].split(";")
    if not media_type.strip().lower().startswith("image/"):
        raise ImageError(INVALID_IMAGE_URL, f"a data URL's media type must be an image type (image/png, ...), "
                         f"got {_quoted(media_type) if media_type else 'none'}")
    if "base64" not in (p.strip().lower() for p in params):
        raise ImageError(INVALID_IMAGE_URL, "an image data URL must be base64 (data:image/png;base64,...)")
    # refused before decoding: base64 is 4 characters per 3 bytes
    if len(data) > (limits.max_image_bytes + 2) // 3 * 4:
        raise ImageError(IMAGE_TOO_LARGE, f"the data URL holds more than {limits.max_image_bytes} bytes; at most "
                         f"{limits.max_image_bytes} are taken")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(INVALID_IMAGE_URL, f"the data URL's data is not valid base64: {e}") from None


async def _fetch(url: str, limits: ImageLimits) -> bytes:
    """GET the image, within the limits' time and bytes; a redirect is followed only on the same host."""
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise ImageError(INVALID_IMAGE_URL, f"the image URL is not valid: {e}") from None
    if not limits.fetch_hosts:
        raise ImageError(IMAGE_URL_NOT_ALLOWED, "this server fetches no image URLs: send the image as a data URL "
                         "(data:image/png;base64,...), or start the server with --image-fetch-hosts naming the host")
    if target.host not in limits.fetch_hosts:
        raise ImageError(IMAGE_URL_NOT_ALLOWED, f"this server fetches images only from {', '.join(limits.fetch_hosts)}"
                         f", not {target.host!r}: send the image as a data URL, or add the host to "
                         "--image-fetch-hosts")
    try:
        # the environment's proxies are not ours to use for a caller's URL
        async with asyncio.timeout(limits.fetch_timeout_s), httpx.AsyncClient(
                timeout=limits.fetch_timeout_s, follow_redirects=False, trust_env=False) as client:
            for _ in range(_MAX_REDIRECTS + 1):
                raw, location = await _get(client, target, limits)
                if location is None:
                    assert raw is not None, target
                    return raw
                if location.host != target.host or location.scheme not in ("http", "https"):
                    raise ImageError(IMAGE_URL_NOT_ALLOWED, f"the image URL redirects to {_quoted(str(location))}, "
                                     "another host: redirects are followed only on the same host")
                target = location
            raise ImageError(INVALID_IMAGE_URL, f"the image URL redirects more than {_MAX_REDIRECTS} times")
    except TimeoutError:
        raise ImageError(INVALID_IMAGE_URL, f"fetching the image took longer than {limits.fetch_timeout_s:g} s") \
            from None
    except (httpx.HTTPError, httpx.InvalidURL) as e:  # InvalidURL: a redirect's Location
        raise ImageError(INVALID_IMAGE_URL, f"fetching the image failed: {type(e).__name__}: {e}") from None


async def _get(client: httpx.AsyncClient, url: httpx.URL, limits: ImageLimits) -> tuple[bytes | None, httpx.URL | None]:
    """(the body, None), or (None, where a redirect points)."""
    # identity: a compressed body could inflate past the limit within one chunk
    headers = {"Accept": "image/png, image/jpeg, image/webp, image/gif", "Accept-Encoding": "identity"}
    async with client.stream("GET", url, headers=headers) as response:
        if response.is_redirect:
            return None, url.join(response.headers["location"])
        if response.status_code != 200:
            raise ImageError(INVALID_IMAGE_URL, f"fetching the image got HTTP {response.status_code}")
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            raise ImageError(INVALID_IMAGE_URL, "the image came compressed (Content-Encoding), which is not taken")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_image_bytes:
            raise ImageError(IMAGE_TOO_LARGE, f"the image is {declared} bytes; at most {limits.max_image_bytes} "
                             "are taken")
        body = bytearray()
        async for chunk in response.aiter_raw():
            if len(body) + len(chunk) > limits.max_image_bytes:  # checked before the chunk is kept
                raise ImageError(IMAGE_TOO_LARGE, f"the image is more than {limits.max_image_bytes} bytes; at most "
                                 f"{limits.max_image_bytes} are taken")
            body += chunk
        return bytes(body), None


def _quoted(text: str) -> str:
    return repr(text if len(text) <= _QUOTED_URL_CHARS else text[:_QUOTED_URL_CHARS] + "...")
