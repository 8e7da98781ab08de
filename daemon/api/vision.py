"""Images in requests, shared by every API family: checks, limits, markers.

Each route walks its request in the order the chat template will render it and hands each
image here; :class:`Images` checks it (:mod:`localllm.images`: strict base64 or a ``data:``
URL, format and size from the header alone, limits from the settings), keeps its base64 for
the runner, and returns the :data:`IMAGE_MARKER` the route puts into the text where the image
goes. So the runner's ``images`` list is in the order the markers appear in the prompt.
"""

from __future__ import annotations

from localllm.images import (
    ImageError,
    ImageLimits,
    check_image,
    decode_base64_image,
    encode_image,
    parse_data_url,
)
from localllm.settings import Settings
from localllm.store.models import LocalModel

from ..errors import HTTPProblem
from ..runner.protocol import IMAGE_MARKER

__all__ = ["IMAGE_MARKER", "Images", "no_vision", "with_markers"]


def no_vision(model: LocalModel) -> str:
    """The one sentence every route that takes images answers for a model without vision."""
    return f"{model.name.short} cannot read images: the model has no vision support"


class Images:
    """The images of one request, in prompt order (what ``GenerationRequest.images`` gets)."""

    def __init__(self, settings: Settings, model: LocalModel) -> None:
        self.model = model
        self.limits = ImageLimits.from_settings(settings)
        self.encoded: list[str] = []
        """Standard base64 of each image's bytes, in the order of their markers."""

    def _admit(self, field: str) -> None:
        # Checked before decoding, so a text-only model or an over-long list costs nothing.
        if "vision" not in self.model.capabilities():
            raise HTTPProblem(400, no_vision(self.model), param=field)
        if len(self.encoded) >= self.limits.max_images:
            raise HTTPProblem(
                400,
                f"{field}: a request may attach at most {self.limits.max_images} images",
                param=field,
            )

    def add_base64(
        self, value: object, field: str, media_type: tuple[str, str] | None = None
    ) -> str:
        """An image as base64 (Ollama's ``images``, Anthropic's base64 source) → its marker.
        ``media_type`` (the type a request declares, and the field declaring it) must then be
        the image's own type."""
        self._admit(field)
        try:
            data = decode_base64_image(value, field, self.limits)
        except ImageError as exc:
            raise HTTPProblem(400, str(exc), param=field) from None
        if media_type is not None:
            declared, where = media_type
            actual = check_image(data, field, self.limits).mime_type
            if declared.lower() != actual:
                raise HTTPProblem(
                    400,
                    f"{where} says {declared} but the image is {actual}",
                    param=where,
                )
        # Re-encoded so the runner always gets plain standard base64 (no line breaks).
        self.encoded.append(encode_image(data))
        return IMAGE_MARKER

    def add_url(self, value: object, field: str) -> str:
        """An image as a ``data:`` URL (OpenAI's ``image_url``) → its marker; a remote URL is
        a 400, as the daemon fetches nothing from the internet."""
        self._admit(field)
        try:
            data = parse_data_url(value, field, self.limits)
        except ImageError as exc:
            raise HTTPProblem(400, str(exc), param=field) from None
        self.encoded.append(encode_image(data))
        return IMAGE_MARKER


def with_markers(text: str, markers: list[str], field: str) -> str:
    """Ollama's placement: a message's (or a prompt's) images go before its text, one marker
    each, unless the text already places exactly that many markers itself."""
    if not markers:
        return text
    present = text.count(IMAGE_MARKER)
    if present == len(markers):
        return text
    if present:
        raise HTTPProblem(
            400,
            f"{field} places {present} image markers {IMAGE_MARKER} but {len(markers)} images "
            "were attached",
            param=field,
        )
    return "".join(markers) + text
