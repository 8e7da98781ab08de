"""Ollama's Modelfile: ``FROM``, ``PARAMETER``, ``TEMPLATE``, ``SYSTEM``, ``LICENSE``, ``MESSAGE``,
``ADAPTER`` (a LoRA adapter GGUF, with an optional scale: ``ADAPTER ./lora.gguf 0.5``; one line
per adapter), ``DRAFT`` (a draft model for speculative decoding: a model name or a GGUF file).

A second ``FROM`` names a vision projector (an mmproj GGUF), as in Ollama.

:func:`parse_modelfile` reads the text into a :class:`Modelfile`; :func:`coerce_parameter` turns
one ``PARAMETER name value`` (also typed at ``/set parameter`` in ``localllm run``) into the
typed option value the API expects. The grammar follows Ollama's parser: instructions are
case-insensitive, ``#`` starts a comment line, a value is the rest of the line, a ``"..."``
string, or a ``\"\"\"...\"\"\"`` block that may span lines; an instruction that is not
understood is an error, so a Modelfile never silently loses a line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._exceptions import LocalLLMError

__all__ = [
    "MESSAGE_ROLES",
    "Modelfile",
    "ModelfileError",
    "coerce_parameter",
    "looks_like_path",
    "parse_modelfile",
    "read_modelfile",
]

MESSAGE_ROLES = ("system", "user", "assistant")
_INSTRUCTIONS = (
    "from",
    "parameter",
    "template",
    "system",
    "license",
    "message",
    "adapter",
    "draft",
)
_TRIPLE = '"""'
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class ModelfileError(LocalLLMError):
    """A Modelfile that cannot be used; the message names the line."""


@dataclass
class Modelfile:
    """The instructions of one Modelfile."""

    from_: str
    """The ``FROM`` value: a model name or a GGUF path (relative paths resolved, see
    :func:`read_modelfile`)."""
    projector: str | None = None
    """A second ``FROM``: a vision projector GGUF (``mmproj``, ``general.architecture`` clip),
    resolved as the first ``FROM`` is."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Typed options; repeated ``stop`` lines collect into a list."""
    template: str | None = None
    """``TEMPLATE``: a chat template (Jinja, as the GGUF's own)."""
    system: str | None = None
    """``SYSTEM``: the default system prompt."""
    license: list[str] = field(default_factory=list)
    """Every ``LICENSE`` text, in order."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """``MESSAGE role content`` lines: an example conversation."""
    draft: str | None = None
    """``DRAFT``: the draft model, a model name or a GGUF path (resolved as ``FROM``'s)."""
    adapters: list[tuple[str, float]] = field(default_factory=list)
    """``ADAPTER path [scale]`` lines in order: a LoRA adapter GGUF (resolved against the
    Modelfile's folder) and its scale (1.0 when not given)."""

    def create_fields(self) -> dict[str, Any]:
        """The ``/api/create`` fields besides the source (``None`` where the file says nothing)."""
        return {
            "template": self.template,
            "system": self.system,
            "parameters": self.parameters or None,
            "license": self.license or None,
            "messages": self.messages or None,
            "draft": self.draft,
        }


def _option_types() -> dict[str, Any]:
    from .models import OPTION_TYPES

    return OPTION_TYPES


def coerce_parameter(name: str, value: str) -> Any:
    """The typed value of ``PARAMETER name value``; raises :class:`ModelfileError`.

    ``stop`` gives a one-element list (callers merge repeated lines).
    """
    expected = _option_types().get(name)
    if expected is None:
        known = ", ".join(sorted(_option_types()))
        raise ModelfileError(f"unknown parameter {name!r} (known: {known})")
    if name == "stop":
        return [value]
    if expected is str or name == "keep_alive":  # a duration: 5m, 1h, -1
        return value
    try:
        if expected is bool:
            lowered = value.lower()
            if lowered not in _TRUE + _FALSE:
                raise ValueError(value)
            return lowered in _TRUE
        if expected is int:
            return int(value)
        return float(value)
    except ValueError:
        kind = {bool: "true or false", int: "an integer"}.get(expected, "a number")
        raise ModelfileError(f"parameter {name!r} must be {kind}, got {value!r}") from None


def looks_like_path(value: str) -> bool:
    """True for a ``FROM`` / ``--from`` value that names a file rather than a model."""
    return value.startswith(("/", "./", "../", "~")) or value.lower().endswith(".gguf")


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"\s*$')


def _unquote(text: str) -> str:
    match = _QUOTED.match(text)
    if not match:
        return text
    try:
        return str(json.loads(f'"{match.group(1)}"'))
    except ValueError:
        return match.group(1)


def _block(first: str, lines: list[str], index: int, number: int) -> tuple[str, int]:
    """The text of a triple-quoted block whose first line, after the quotes, is ``first``;
    returns it and the index of the line after the block."""
    if len(first) >= 3 and first.endswith(_TRIPLE):
        return first[:-3], index
    block = [first]
    while index < len(lines):
        line = lines[index].rstrip()
        index += 1
        if line.endswith(_TRIPLE):
            block.append(line[:-3])
            return "\n".join(block), index
        block.append(lines[index - 1])
    raise ModelfileError(f'line {number}: unterminated """ block')


def _instructions(text: str) -> list[tuple[int, str, str, str]]:
    """(line number, instruction, name, value) for every instruction; ``name`` is the
    parameter name or message role (empty for the others)."""
    lines = text.splitlines()
    out: list[tuple[int, str, str, str]] = []
    index = 0
    while index < len(lines):
        number = index + 1
        line = lines[index].strip()
        index += 1
        if not line or line.startswith("#"):
            continue
        keyword, rest = [*re.split(r"\s+", line, maxsplit=1), ""][:2]
        keyword = keyword.lower()
        if keyword not in _INSTRUCTIONS:
            raise ModelfileError(f"line {number}: unknown instruction {keyword.upper()!r}")
        name = ""
        if keyword in ("parameter", "message"):
            name, rest = [*re.split(r"\s+", rest, maxsplit=1), ""][:2]
        value = rest.strip()
        if value.startswith(_TRIPLE):
            value, index = _block(value[3:], lines, index, number)
        else:
            value = _unquote(value)
        out.append((number, keyword, name, value))
    return out


def _adapter(raw: str, number: int) -> tuple[str, float]:
    """``ADAPTER``'s value: a path, then an optional scale (a number)."""
    path, scale = raw.strip(), 1.0
    parts = path.rsplit(None, 1)
    if len(parts) == 2:
        try:
            scale = float(parts[1])
        except ValueError:
            pass
        else:
            if scale != scale or scale in (float("inf"), float("-inf")):
                raise ModelfileError(f"line {number}: ADAPTER's scale must be a finite number")
            path = _unquote(parts[0].strip())
    if not path:
        raise ModelfileError(f"line {number}: ADAPTER needs a LoRA adapter file (and a scale)")
    return path, scale


def parse_modelfile(text: str) -> Modelfile:
    """Parse a Modelfile's text; raises :class:`ModelfileError` naming the line at fault."""
    source: str | None = None
    result = Modelfile(from_="")
    for number, keyword, name, raw in _instructions(text):
        if keyword == "from":
            if not raw:
                raise ModelfileError(f"line {number}: FROM needs a model name or a file")
            if source is None:
                source = raw
            elif result.projector is None:
                # Ollama's way to add a vision projector: a second FROM naming its GGUF.
                result.projector = raw
            else:
                raise ModelfileError(
                    f"line {number}: at most two FROM lines (the model, then a vision projector)"
                )
        elif keyword == "adapter":
            result.adapters.append(_adapter(raw, number))
        elif keyword == "draft":
            if not raw:
                raise ModelfileError(f"line {number}: DRAFT needs a model name or a file")
            if result.draft is not None:
                raise ModelfileError(f"line {number}: only one DRAFT is supported")
            result.draft = raw
        elif keyword in ("template", "system"):
            setattr(result, keyword, raw)
        elif keyword == "license":
            result.license.append(raw)
        elif keyword == "parameter":
            value = raw
            if not name or not value:
                raise ModelfileError(f"line {number}: PARAMETER needs a name and a value")
            try:
                typed = coerce_parameter(name.lower(), value)
            except ModelfileError as exc:
                raise ModelfileError(f"line {number}: {exc}") from None
            if name.lower() == "stop":
                result.parameters.setdefault("stop", []).extend(typed)
            else:
                result.parameters[name.lower()] = typed
        elif keyword == "message":
            role, content = name, raw
            if role.lower() not in MESSAGE_ROLES:
                raise ModelfileError(
                    f"line {number}: MESSAGE role must be one of {', '.join(MESSAGE_ROLES)}, "
                    f"got {role!r}"
                )
            result.messages.append({"role": role.lower(), "content": content})
    if source is None:
        raise ModelfileError("the Modelfile has no FROM line")
    result.from_ = source
    return result


def read_modelfile(path: Path) -> Modelfile:
    """Read and parse the Modelfile at ``path``; a relative ``FROM`` file path (or a file that
    exists next to the Modelfile) is made absolute against the Modelfile's folder."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelfileError(f"{path}: no such Modelfile") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelfileError(f"{path}: cannot read it ({exc})") from None
    modelfile = parse_modelfile(text)
    value = modelfile.from_
    candidate = (path.parent / Path(value).expanduser()).resolve()
    if looks_like_path(value) or candidate.is_file() or candidate.is_dir():
        modelfile.from_ = str(candidate)  # a GGUF file, or a safetensors folder
    if modelfile.draft is not None:
        draft = (path.parent / Path(modelfile.draft).expanduser()).resolve()
        if looks_like_path(modelfile.draft) or draft.is_file():
            modelfile.draft = str(draft)
    if modelfile.projector is not None:
        modelfile.projector = str((path.parent / Path(modelfile.projector).expanduser()).resolve())
    modelfile.adapters = [
        (str((path.parent / Path(file).expanduser()).resolve()), scale)
        for file, scale in modelfile.adapters
    ]
    return modelfile
