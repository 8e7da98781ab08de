"""Images attached to requests: strict decoding and limits, in one place.

Every route that takes images (Ollama's ``images``, OpenAI's ``image_url`` data URLs, the
Responses API's ``input_image``, Anthropic's ``image`` blocks) and the CLI/TUI hand the bytes
here before anything else sees them. Only the header is read (``PIL.Image.open`` is lazy: it
parses the header and decodes no pixels), so a decompression bomb — a small PNG that claims
100 megapixels — is refused before llama.cpp's image decoder (stb_image) would allocate for it.
The formats accepted are the ones stb_image decodes.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._exceptions import LocalLLMError

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageError",
    "ImageInfo",
    "ImageLimits",
    "check_image",
    "decode_base64_image",
    "encode_image",
    "extract_image_paths",
    "parse_data_url",
]

SUPPORTED_FORMATS = ("PNG", "JPEG", "GIF", "BMP")
"""Pillow's names of the formats llama.cpp's image loader (stb_image) decodes."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
"""File names the CLI and TUI attach as images when a prompt names them."""

_DATA_URL = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[^,;]*)*?);base64,(?P<data>.*)", re.S
)


class ImageError(LocalLLMError):
    """An attached image that cannot be used; the message names the field and says why."""


@dataclass(frozen=True)
class ImageLimits:
    """What one request may attach (from :class:`localllm.settings.Settings`)."""

    max_bytes: int = 20 << 20
    """Largest decoded file."""
    max_pixels: int = 40_000_000
    """Most width x height, read from the header."""
    max_images: int = 16
    """Most images in one request."""

    @classmethod
    def from_settings(cls, settings: Settings) -> ImageLimits:
        """The limits the settings give (``LOCALLLM_MAX_IMAGE_*``)."""
        return cls(
            max_bytes=settings.max_image_bytes,
            max_pixels=settings.max_image_pixels,
            max_images=settings.max_images,
        )


@dataclass(frozen=True)
class ImageInfo:
    """What the header says about an accepted image."""

    format: str
    """Pillow's format name: PNG, JPEG, GIF or BMP."""
    width: int
    """Pixels across."""
    height: int
    """Pixels down."""
    size: int
    """Bytes of the file."""

    @property
    def mime_type(self) -> str:
        """``image/png``, ``image/jpeg``, ``image/gif`` or ``image/bmp``."""
        return f"image/{self.format.lower()}"


def _human(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"


def check_image(data: bytes, field: str, limits: ImageLimits) -> ImageInfo:
    """Check an image file's bytes against ``limits`` from its header; raise naming ``field``."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageError(f"{field} is empty: expected the bytes of a PNG or JPEG image")
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"{field} is {_human(len(data))}, more than the {_human(limits.max_bytes)} an image "
            "may have"
        )
    try:
        # Pillow warns (and past twice its own limit raises) about bombs; the limit here is
        # ours, checked against the header's size below, so its own check is muted.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                kind = image.format or "unknown"
                width, height = image.size
    except Image.DecompressionBombError:
        raise ImageError(f"{field} is too large: more than {limits.max_pixels} pixels") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ImageError(f"{field} is not an image: use PNG or JPEG") from None
    if kind not in SUPPORTED_FORMATS:
        raise ImageError(f"{field}: image format {kind} is not supported; use PNG or JPEG")
    if width <= 0 or height <= 0:
        raise ImageError(f"{field} is an image of no pixels ({width}x{height})")
    if width * height > limits.max_pixels:
        raise ImageError(
            f"{field} is {width}x{height} pixels, more than the {limits.max_pixels} an image "
            "may have; scale it down"
        )
    return ImageInfo(format=kind, width=width, height=height, size=len(data))


def decode_base64_image(text: object, field: str, limits: ImageLimits) -> bytes:
    """Strict standard base64 (no stray characters) → the image's bytes, checked."""
    if not isinstance(text, str):
        raise ImageError(f"{field} must be a base64 string, got {type(text).__name__}")
    # Refuse before decoding a string far over the limit: base64 is 4/3 of the bytes, plus
    # a line break every 76 characters in MIME-style base64.
    encoded = (limits.max_bytes // 3 + 2) * 4
    if len(text) > encoded + encoded // 38 + 1024:
        raise ImageError(f"{field} is more than the {_human(limits.max_bytes)} an image may have")
    compact = "".join(text.split())  # line breaks (MIME-style base64) are fine
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{field} is not valid base64") from None
    check_image(data, field, limits)
    return data


def parse_data_url(url: object, field: str, limits: ImageLimits) -> bytes:
    """A ``data:image/...;base64,...`` URL → the image's bytes, checked.

    A remote URL is refused: the daemon never fetches from the internet on a request's behalf.
    """
    if not isinstance(url, str) or not url:
        raise ImageError(f"{field} must be a data: URL string")
    lowered = url[:16].lower()
    if lowered.startswith(("http://", "https://")):
        raise ImageError(
            f"{field}: the daemon does not fetch images from the internet; send the image "
            "inline as a data: URL"
        )
    match = _DATA_URL.fullmatch(url)
    if not lowered.startswith("data:") or match is None:
        raise ImageError(
            f"{field} must be a data: URL with base64 image bytes (data:image/png;base64,...)"
        )
    return decode_base64_image(match.group("data"), field, limits)


def encode_image(data: bytes) -> str:
    """Standard base64 of an image file's bytes, as requests and the runner carry it."""
    return base64.b64encode(data).decode("ascii")


_EXT = r"(?:png|jpe?g|gif|bmp)"
# A path as typed or pasted: quoted (drag-and-drop in many terminals), or bare with
# backslash-escaped spaces (drag-and-drop in others). As Ollama's CLI, a bare path must look
# like one (start with /, ./, ../ or ~/) so ordinary words ending in .png stay text.
_PATH = re.compile(
    rf"""(?<!\S)(?:(['"])(?P<quoted>[^'"\n]+?\.{_EXT})\1(?![\w'"])"""
    rf"""|(?P<bare>(?:~|\.{{1,2}})?/(?:\\.|[^\s'"\\])*?\.{_EXT})(?![\w.]))""",
    re.I,
)


def extract_image_paths(text: str) -> tuple[str, list[tuple[str, Path]]]:
    """Image files named in a prompt, as ``localllm run`` (and Ollama's CLI) attach them.

    Returns the prompt without the paths of files that exist, and ``(as typed, path)`` for
    each of those files in order of appearance. A path that names no file stays in the text.
    """
    found: list[tuple[str, Path]] = []

    def take(match: re.Match[str]) -> str:
        typed = match.group("quoted") or match.group("bare")
        path = Path(re.sub(r"\\(.)", r"\1", typed)).expanduser()
        if not path.is_file():
            return match.group(0)
        found.append((re.sub(r"\\(.)", r"\1", typed), path))
        return ""

    rest = _PATH.sub(take, text)
    if not found:
        return text, []
    return re.sub(r"[ \t]{2,}", " ", rest).strip(), found
