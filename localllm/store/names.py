"""Model names: ``[host/][namespace/]model[:tag]``, Ollama's grammar, plus ``hf.co/<user>/<repo>``.

A parsed :class:`ModelName` is safe to turn into a path under the store: every part is checked
against a whitelist of characters and lengths, so nothing in a name can reach outside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._exceptions import InvalidNameError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TAG",
    "HF_HOST",
    "ModelName",
    "parse_name",
]

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
HF_HOST = "hf.co"
_HF_ALIASES = frozenset({"hf.co", "huggingface.co", "www.huggingface.co"})

MAX_PART = 80
MAX_HOST = 350

# A part starts with a letter, digit or underscore (so never "." or "..") and continues with
# letters, digits and "_ - ."; a host may also carry a ":port".
_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*(:[0-9]{1,5})?")


def _describe_bad_chars(part: str, allowed_punctuation: str) -> str:
    bad = sorted(
        {c for c in part if not (c.isascii() and (c.isalnum() or c in allowed_punctuation))}
    )
    return ", ".join(repr(c) if c.isprintable() else f"U+{ord(c):04X}" for c in bad)


def _check_part(text: str, kind: str, value: str, pattern: re.Pattern[str], limit: int) -> None:
    if value == "":
        raise InvalidNameError(f'invalid model name "{text}": the {kind} is empty')
    if len(value) > limit:
        raise InvalidNameError(
            f'invalid model name "{text}": the {kind} is {len(value)} characters long '
            f"(at most {limit})"
        )
    if value in (".", ".."):
        raise InvalidNameError(f'invalid model name "{text}": the {kind} cannot be "{value}"')
    if pattern.fullmatch(value):
        return
    bad = _describe_bad_chars(value, "_.-:" if kind == "host" else "_.-")
    if bad:
        raise InvalidNameError(
            f'invalid model name "{text}": the {kind} "{value}" contains {bad}; '
            'use letters, digits, "_", "-" and "."'
        )
    raise InvalidNameError(
        f'invalid model name "{text}": the {kind} "{value}" must start with a letter, digit or "_"'
    )


@dataclass(frozen=True, order=True)
class ModelName:
    """A validated model name. Build one with :func:`parse_name`."""

    host: str
    """Registry host, ``registry.ollama.ai`` by default, ``hf.co`` for Hugging Face."""
    namespace: str
    """User or organisation; ``library`` for official Ollama models."""
    model: str
    """The model (repository) name."""
    tag: str
    """Variant: size, quantization, or for Hugging Face a quant or a ``.gguf`` file name."""

    @property
    def is_huggingface(self) -> bool:
        """True for ``hf.co/<user>/<repo>`` names."""
        return self.host == HF_HOST

    @property
    def repo_id(self) -> str:
        """``user/repo`` as the Hugging Face Hub spells it."""
        return f"{self.namespace}/{self.model}"

    @property
    def full(self) -> str:
        """Every part spelled out: ``registry.ollama.ai/library/smollm2:135m``."""
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def short(self) -> str:
        """The name as people write it: defaults left out (``smollm2:135m``)."""
        if self.host == DEFAULT_HOST and self.namespace == DEFAULT_NAMESPACE:
            base = self.model
        elif self.host == DEFAULT_HOST:
            base = f"{self.namespace}/{self.model}"
        else:
            base = f"{self.host}/{self.namespace}/{self.model}"
        return f"{base}:{self.tag}"

    @property
    def path_parts(self) -> tuple[str, str, str, str]:
        """Path components of the manifest under ``manifests/`` (all validated)."""
        return (self.host, self.namespace, self.model, self.tag)

    def with_tag(self, tag: str) -> ModelName:
        """The same model with another tag (validated)."""
        return parse_name(f"{self.host}/{self.namespace}/{self.model}:{tag}")

    def __str__(self) -> str:
        return self.short


def parse_name(text: str) -> ModelName:
    """Parse and validate a model name, filling in defaults.

    Raises :class:`InvalidNameError` with a message that says which part is wrong and why.
    """
    if not isinstance(text, str):
        raise InvalidNameError(f"a model name must be a string, not {type(text).__name__}")
    original = text
    text = text.strip()
    if not text:
        raise InvalidNameError("the model name is empty")
    if "\x00" in text:
        raise InvalidNameError(f"invalid model name {original!r}: it contains a NUL byte")
    if "\\" in text:
        raise InvalidNameError(f'invalid model name "{text}": backslashes are not allowed')
    if text.startswith("/"):
        raise InvalidNameError(
            f'invalid model name "{text}": a name cannot be an absolute path '
            "(to import a file use `localllm create NAME --from FILE.gguf`)"
        )
    for scheme in ("https://", "http://"):
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]

    if any(piece in (".", "..") for piece in text.replace(":", "/").split("/")):
        raise InvalidNameError(
            f'invalid model name "{text}": a part cannot be ".." or "." (no paths in names)'
        )
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        body, tag = text[:colon], text[colon + 1 :]
        if tag == "":
            raise InvalidNameError(f'invalid model name "{original.strip()}": the tag is empty')
    else:
        body, tag = text, DEFAULT_TAG

    parts = body.split("/")
    if len(parts) > 3:
        raise InvalidNameError(
            f'invalid model name "{text}": too many "/" (expected [host/][namespace/]model[:tag])'
        )
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        host, (namespace, model) = DEFAULT_HOST, parts
        if namespace.lower() in _HF_ALIASES:
            raise InvalidNameError(
                f'invalid model name "{text}": Hugging Face names are hf.co/<user>/<repo>[:<quant>]'
            )
    else:
        host, namespace, model = DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0]

    if host.lower() in _HF_ALIASES:
        host = HF_HOST
    _check_part(text, "host", host, _HOST_RE, MAX_HOST)
    _check_part(text, "namespace", namespace, _PART_RE, MAX_PART)
    _check_part(text, "model", model, _PART_RE, MAX_PART)
    _check_part(text, "tag", tag, _PART_RE, MAX_PART)
    return ModelName(host=host.lower(), namespace=namespace, model=model, tag=tag)
