"""Input images: each format to its pixels, every mode to RGB, and the limits checked before the work they bound
(a header's size before decoding, bytes while they are read, a fetch's time), against real files and a real
HTTP server on loopback."""

from __future__ import annotations

import base64
import http.server
import io
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from voice_gateway.media.images import ImageError, ImageLimits, decode_image, image_from_url

LIMITS = ImageLimits()


def _encode(image: Image.Image, fmt: str, **save: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def _pattern(width: int = 6, height: int = 4) -> np.ndarray:
    """Distinct colours in each pixel, so a turned or flipped image shows."""
    y, x = np.mgrid[:height, :width]
    return np.stack([x * 40, y * 60, (x + y) * 15], axis=2).astype(np.uint8)


def _code(raw: bytes, limits: ImageLimits = LIMITS) -> str:
    with pytest.raises(ImageError) as caught:
        decode_image(raw, limits)
    return caught.value.code


@pytest.mark.parametrize("fmt, save", [("PNG", {}), ("WEBP", {"lossless": True})])
def test_lossless_formats_decode_to_their_pixels(fmt: str, save: dict) -> None:
    pixels = _pattern()
    decoded = decode_image(_encode(Image.fromarray(pixels), fmt, **save), LIMITS)
    assert decoded.dtype == np.uint8 and decoded.shape == (4, 6, 3)
    np.testing.assert_array_equal(decoded, pixels)


def test_jpeg_decodes_close_to_its_pixels() -> None:
    pixels = np.full((16, 24, 3), (200, 40, 90), np.uint8)
    decoded = decode_image(_encode(Image.fromarray(pixels), "JPEG", quality=95), LIMITS)
    assert decoded.shape == (16, 24, 3)
    assert np.abs(decoded.astype(int) - pixels).max() <= 4


def test_a_jpeg_past_the_model_s_budget_decodes_nearer_it() -> None:
    """A JPEG larger than what the model looks at decodes at a libjpeg scale that still holds the size the model's
    resize makes (2048 x 1536 within 409,600 pixels: 736 x 544), and resized there its pixels are within about a
    level of the whole decode's; a PNG, and a JPEG within the budget, decode whole."""
    y, x = np.mgrid[:1536, :2048]
    noise = np.random.default_rng(3).integers(-12, 12, (1536, 2048, 3))
    photo = (np.stack([x // 8, y // 6, (x + y) // 14], axis=2) % 256 + noise).clip(0, 255).astype(np.uint8)
    raw, budget = _encode(Image.fromarray(photo), "JPEG", quality=90), 400 * 32 * 32
    whole, near = decode_image(raw, LIMITS), decode_image(raw, LIMITS, budget)
    assert whole.shape == (1536, 2048, 3) and near.shape == (768, 1024, 3)
    resized = [np.asarray(Image.fromarray(a).resize((736, 544), Image.Resampling.BICUBIC), dtype=np.int16)
               for a in (whole, near)]
    assert np.abs(resized[0] - resized[1]).mean() < 1.5
    assert decode_image(_encode(Image.fromarray(photo), "PNG"), LIMITS, budget).shape == (1536, 2048, 3)
    small = _encode(Image.fromarray(photo[:480, :640]), "JPEG")
    assert decode_image(small, LIMITS, budget).shape == (480, 640, 3)


def test_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (5, 3), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    raw = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    decoded = decode_image(raw, LIMITS)
    assert decoded.shape == (3, 5, 3)
    assert (decoded == (255, 0, 0)).all()


def test_alpha_is_laid_over_white() -> None:
    rgba = np.zeros((1, 3, 4), np.uint8)
    rgba[0] = [(10, 20, 30, 255), (10, 20, 30, 0), (0, 0, 0, 128)]
    decoded = decode_image(_encode(Image.fromarray(rgba, "RGBA"), "PNG"), LIMITS).astype(int)
    assert decoded[0, 0].tolist() == [10, 20, 30]
    assert decoded[0, 1].tolist() == [255, 255, 255]
    assert np.abs(decoded[0, 2] - 127).max() <= 1  # black, half covering white


def test_a_palette_s_transparent_index_is_white() -> None:
    image = Image.new("P", (2, 1))
    image.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    image.putpixel((0, 0), 0)
    image.putpixel((1, 0), 1)
    decoded = decode_image(_encode(image, "PNG", transparency=0), LIMITS)
    assert decoded[0].tolist() == [[255, 255, 255], [0, 255, 0]]
    opaque = decode_image(_encode(image, "GIF"), LIMITS)
    assert opaque[0].tolist() == [[255, 0, 0], [0, 255, 0]]


def test_greyscale_and_16_bit_greyscale_become_grey_rgb() -> None:
    grey = np.array([[0, 100, 255]], np.uint8)
    assert decode_image(_encode(Image.fromarray(grey, "L"), "PNG"), LIMITS)[0].tolist() == [
        [0, 0, 0], [100, 100, 100], [255, 255, 255]]
    deep = Image.fromarray(np.array([[0, 32896, 65535]], np.uint16))  # I;16
    assert decode_image(_encode(deep, "PNG"), LIMITS)[0, :, 0].tolist() == [0, 128, 255]


def test_cmyk_jpeg_becomes_rgb() -> None:
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # full magenta and yellow: red
    decoded = decode_image(_encode(cmyk, "JPEG", quality=95), LIMITS).astype(int)
    assert decoded.shape == (8, 8, 3)
    assert np.abs(decoded - (255, 0, 0)).max() <= 8


def test_exif_orientation_turns_the_image_upright() -> None:
    pixels = _pattern(6, 4)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned left: shown turned 90 degrees clockwise
    decoded = decode_image(_encode(Image.fromarray(pixels), "PNG", exif=exif), LIMITS)
    np.testing.assert_array_equal(decoded, np.rot90(pixels, k=-1))


def test_what_is_not_an_image_of_ours_is_refused() -> None:
    assert _code(b"hello, I am text") == "invalid_image"
    assert _code(b"") == "invalid_image"
    assert _code(_encode(Image.new("RGB", (4, 4)), "BMP")) == "invalid_image"  # an image, not a format we take
    assert _code(b"GIF89a") == "invalid_image"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_truncated_and_corrupt_files_are_refused(fmt: str) -> None:
    rng = np.random.default_rng(0)
    raw = _encode(Image.fromarray(rng.integers(0, 255, (64, 64, 3), np.uint8)), fmt)
    assert _code(raw[: len(raw) // 2]) == "invalid_image"
    assert _code(raw[:40]) == "invalid_image"
    corrupt = bytearray(raw)
    corrupt[len(raw) // 3 : len(raw) // 3 + 64] = bytes(64)
    if fmt in ("PNG", "GIF"):  # JPEG and lossy WebP decode through most damage, as they should
        assert _code(bytes(corrupt)) == "invalid_image"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_a_png_claiming_a_huge_canvas_is_refused_from_its_header(monkeypatch: pytest.MonkeyPatch) -> None:
    """20000 x 20000 RGB would be 1.2 GB decoded; the file is 70 bytes. Its pixels are never asked for."""
    ihdr = struct.pack(">IIBBBBB", 20_000, 20_000, 8, 2, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")
    assert len(raw) < 100

    def no_decoding(self: object) -> None:
        raise AssertionError("the image was decoded")

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", no_decoding)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ImageError) as caught:
            decode_image(raw, LIMITS)
        elapsed_s = time.perf_counter() - started
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.code == "image_too_large"
    assert "20000 x 20000" in str(caught.value)
    assert elapsed_s < 0.5 and peak_bytes < 1024 * 1024


def test_a_webp_claiming_a_huge_canvas_is_refused_from_its_header() -> None:
    # VP8X: 16384 x 16384, which libwebp would allocate when the file is opened
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0" + (16383).to_bytes(3, "little") * 2
    raw = b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x
    assert _code(raw) == "image_too_large"


def test_a_gif_frame_that_grows_its_canvas_past_the_limit_is_refused() -> None:
    screen = b"GIF89a" + struct.pack("<HH", 2, 2) + b"\0\0\0"  # a 2 x 2 canvas, no colour table
    frame = b"," + struct.pack("<HHHH", 0, 0, 5000, 5000) + b"\0" + b"\2\2\x44\1\0"  # a 5000 x 5000 frame
    assert _code(screen + frame + b";") == "image_too_large"


def test_pixels_over_the_limit_are_refused() -> None:
    raw = _encode(Image.new("RGB", (100, 100)), "PNG")
    assert decode_image(raw, ImageLimits(max_image_pixels=100 * 100)).shape == (100, 100, 3)
    assert _code(raw, ImageLimits(max_image_pixels=100 * 99)) == "image_too_large"


def test_bytes_over_the_limit_are_refused_before_anything_else() -> None:
    limits = ImageLimits(max_image_bytes=4096)
    assert _code(b"x" * 4097, limits) == "image_too_large"


async def _url_code(url: str, limits: ImageLimits = LIMITS) -> tuple[str, str]:
    with pytest.raises(ImageError) as caught:
        await image_from_url(url, limits)
    return caught.value.code, str(caught.value)


def _data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


async def test_a_data_url_decodes() -> None:
    pixels = _pattern()
    decoded = await image_from_url(_data_url(_encode(Image.fromarray(pixels), "PNG")), LIMITS)
    np.testing.assert_array_equal(decoded, pixels)


async def test_bad_data_urls_are_refused() -> None:
    png = _encode(Image.new("RGB", (2, 2)), "PNG")
    assert (await _url_code("data:image/png;base64,!!not base64!!"))[0] == "invalid_image_url"
    code, message = await _url_code(_data_url(png, "text/plain"))
    assert code == "invalid_image_url" and "image type" in message
    assert (await _url_code("data:image/png," + png.hex()))[0] == "invalid_image_url"  # not base64
    assert (await _url_code("data:image/png;base64"))[0] == "invalid_image_url"
    assert (await _url_code("ftp://example.com/a.png"))[0] == "invalid_image_url"
    assert (await _url_code(_data_url(b"not an image at all")))[0] == "invalid_image"
    limits = ImageLimits(max_image_bytes=4096)
    assert (await _url_code(_data_url(bytes(8192)), limits))[0] == "image_too_large"


async def test_http_urls_are_refused_while_fetching_is_off() -> None:
    code, message = await _url_code("https://example.com/cat.png")
    assert code == "image_url_not_allowed" and "--image-fetch-hosts" in message and "data URL" in message
    code, message = await _url_code("http://elsewhere.example/cat.png", ImageLimits(fetch_hosts=("example.com",)))
    assert code == "image_url_not_allowed" and "'elsewhere.example'" in message
    code, _ = await _url_code("http://example.com@elsewhere.example/", ImageLimits(fetch_hosts=("example.com",)))
    assert code == "image_url_not_allowed"


def test_fetch_hosts_are_bare_host_names() -> None:
    for bad in ("https://example.com", "example.com:8080", "Example.com", "example.com/images", ""):
        with pytest.raises(ValueError):
            ImageLimits(fetch_hosts=(bad,))
    assert ImageLimits(fetch_hosts=("example.com", "127.0.0.1", "::1")).fetch_hosts[2] == "::1"
    with pytest.raises(ValueError):
        ImageLimits(max_images_per_request=20, max_images_per_session=16)


PNG = _encode(Image.fromarray(_pattern()), "PNG")
BIG_BYTES = 64 * 1024  # the served limit's tests: ImageLimits(max_image_bytes=BIG_BYTES)


class _Images(http.server.BaseHTTPRequestHandler):
    """/ok.png; /big (past the limit, no length: read until it ends), /big-declared (says so up front);
    /slow (one byte a second); /same (redirects here), /away (to another host name); /missing (404)."""

    protocol_version = "HTTP/1.0"  # a body without Content-Length runs to the connection's close

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        port = self.server.server_address[1]
        try:
            if self.path == "/ok.png":
                self._send(200, PNG, {"Content-Type": "image/png", "Content-Length": str(len(PNG))})
            elif self.path == "/big":
                self._send(200, PNG + bytes(4 * BIG_BYTES), {"Content-Type": "image/png"})
            elif self.path == "/big-declared":
                self._send(200, b"", {"Content-Length": str(4 * BIG_BYTES)})
            elif self.path == "/slow":
                self._send(200, b"", {"Content-Type": "image/png"})
                for byte in PNG:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(1.0)
            elif self.path == "/same":
                self._send(302, b"", {"Location": "/ok.png"})
            elif self.path == "/away":
                self._send(302, b"", {"Location": f"http://localhost:{port}/ok.png"})
            else:
                self._send(404, b"no such image", {})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


SERVED = ImageLimits(max_image_bytes=BIG_BYTES, fetch_hosts=("127.0.0.1",), fetch_timeout_s=1.0)


async def test_an_allow_listed_host_s_image_is_fetched(image_host: str) -> None:
    np.testing.assert_array_equal(await image_from_url(f"{image_host}/ok.png", SERVED), _pattern())
    np.testing.assert_array_equal(await image_from_url(f"{image_host}/same", SERVED), _pattern())


async def test_a_body_past_the_limit_is_refused_while_it_is_read(image_host: str) -> None:
    assert (await _url_code(f"{image_host}/big", SERVED))[0] == "image_too_large"
    assert (await _url_code(f"{image_host}/big-declared", SERVED))[0] == "image_too_large"


async def test_a_slow_server_is_given_up_on_at_the_timeout(image_host: str) -> None:
    started = time.perf_counter()
    code, message = await _url_code(f"{image_host}/slow", SERVED)
    elapsed_s = time.perf_counter() - started
    assert code == "invalid_image_url" and "longer than 1 s" in message
    assert 0.9 < elapsed_s < 3.0  # the timeout, not the 80 s the body would take


async def test_redirects_elsewhere_and_failures_are_refused(image_host: str) -> None:
    code, message = await _url_code(f"{image_host}/away", SERVED)
    assert code == "image_url_not_allowed" and "another host" in message
    code, message = await _url_code(f"{image_host}/missing", SERVED)
    assert code == "invalid_image_url" and "404" in message
