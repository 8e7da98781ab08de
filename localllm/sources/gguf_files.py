"""Which GGUF file(s) of a Hugging Face repository a tag means.

A repository holds one model in several quantizations (``Model-Q4_K_M.gguf``,
``model.q8_0.gguf``, ``Q6_K/model-00001-of-00002.gguf``...). A tag picks one:

* ``latest`` (no tag): Q4_K_M, else the nearest sensible one in :data:`DEFAULT_PREFERENCE`;
* a quant name, matched case-insensitively (``q8_0``, ``UD-Q4_K_XL``);
* a file name ending in ``.gguf``.

A split model (``<prefix>-00001-of-00003.gguf``...) is one choice made of all its parts, in
order. Projector (``mmproj``) and importance-matrix files are never chosen as the model; a
projector next to the chosen model is pulled with it (:func:`choose_projector`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .._exceptions import PullError, RemoteNotFoundError

__all__ = [
    "DEFAULT_PREFERENCE",
    "GGUFChoice",
    "HubFile",
    "choose_gguf",
    "choose_projector",
    "quant_of",
    "split_of",
]

# Nearest first: same size class, then a little bigger, then smaller, then much bigger.
DEFAULT_PREFERENCE = (
    "Q4_K_M",
    "Q4_K_S",
    "Q4_K_L",
    "Q4_K_XL",
    "UD-Q4_K_XL",
    "IQ4_XS",
    "IQ4_NL",
    "Q4_0",
    "Q4_1",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_0",
    "Q5_1",
    "Q3_K_L",
    "Q3_K_M",
    "Q6_K",
    "Q3_K_S",
    "Q8_0",
    "Q2_K",
    "BF16",
    "F16",
    "F32",
)

_SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)
# A quant token between separators: Q4_K_M, IQ3_XXS, TQ1_0, Q4_0_4_4, F16, BF16, MXFP4, UD-...
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:[IT]?Q[1-8](?:_[A-Za-z0-9]{1,3})*|B?F(?:16|32)|FP(?:16|32)"
    r"|MXFP4(?:_MOE)?))(?![A-Za-z0-9])",
    re.I,
)
_NOT_A_MODEL = ("mmproj", "imatrix")
_ALIASES = {"FP16": "F16", "FP32": "F32", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q3_K": "Q3_K_M"}


@dataclass(frozen=True)
class HubFile:
    """One file of a repository, as the Hub lists it."""

    path: str
    """Path in the repository (may contain folders)."""
    size: int
    """Bytes (of the real file, not the LFS pointer)."""
    sha256: str | None
    """Hex sha256 from the LFS metadata; ``None`` for files not stored with LFS."""
    blob_id: str | None = None
    """The git object id (sha1) the Hub lists: for a file stored in git itself (no LFS), what
    its bytes are checked against."""


@dataclass(frozen=True)
class GGUFChoice:
    """The file(s) a tag resolved to."""

    files: tuple[HubFile, ...]
    """One file, or every part of a split model in order."""
    quant: str | None
    """The quantization named in the file name (``Q4_K_M``), if any."""
    note: str
    """What was picked and why, for the person pulling."""

    @property
    def size(self) -> int:
        """Bytes of all the files."""
        return sum(f.size for f in self.files)


def _normal(quant: str) -> str:
    upper = quant.upper()
    return _ALIASES.get(upper, upper)


def split_of(path: str) -> tuple[str, int, int] | None:
    """``(prefix, index, count)`` for ``<prefix>-0000i-of-0000n.gguf``, else ``None``."""
    match = _SPLIT_RE.match(path)
    if not match:
        return None
    return match.group("prefix"), int(match.group("index")), int(match.group("count"))


def quant_of(path: str) -> str | None:
    """The quantization a GGUF's path names, upper-cased (``Q4_K_M``), or ``None``.

    The file name wins over folder names; within a name the last quant token does.
    """
    split = split_of(path)
    stem = split[0] if split else re.sub(r"\.gguf$", "", path, flags=re.I)
    for part in reversed(stem.split("/")):
        found = _QUANT_RE.findall(part)
        if found:
            return _normal(found[-1])
    return None


@dataclass(frozen=True)
class _Candidate:
    files: tuple[HubFile, ...]
    quant: str | None

    @property
    def label(self) -> str:
        return self.quant or self.files[0].path.rsplit("/", 1)[-1]


def _candidates(files: Sequence[HubFile]) -> list[_Candidate]:
    singles: list[_Candidate] = []
    splits: dict[tuple[str, int], list[tuple[int, HubFile]]] = {}
    for hub_file in files:
        name = hub_file.path.rsplit("/", 1)[-1].lower()
        if not name.endswith(".gguf") or any(word in name for word in _NOT_A_MODEL):
            continue
        split = split_of(hub_file.path)
        if split is None:
            singles.append(_Candidate((hub_file,), quant_of(hub_file.path)))
        else:
            prefix, index, count = split
            splits.setdefault((prefix, count), []).append((index, hub_file))
    grouped = []
    for (prefix, count), parts in splits.items():
        parts.sort(key=lambda item: item[0])
        indices = [index for index, _ in parts]
        if indices != list(range(1, count + 1)):
            missing = sorted(set(range(1, count + 1)) - set(indices))
            raise PullError(
                f"the split model {prefix} is incomplete on the Hub: part {missing[0]:05d} "
                f"of {count:05d} is missing"
            )
        grouped.append(_Candidate(tuple(f for _, f in parts), quant_of(parts[0][1].path)))
    # Single files before split sets of the same quant: fewer requests, same model.
    return singles + grouped


def _preference_rank(candidate: _Candidate) -> int:
    if candidate.quant in DEFAULT_PREFERENCE:
        return DEFAULT_PREFERENCE.index(candidate.quant)
    return len(DEFAULT_PREFERENCE)


def _describe(candidate: _Candidate) -> str:
    first = candidate.files[0].path
    if len(candidate.files) > 1:
        return f"{first} and {len(candidate.files) - 1} more parts"
    return first


def _available_quants(candidates: Sequence[_Candidate]) -> list[str]:
    """Labels of the candidates, nearest to the default first, without repeats."""
    labels: list[str] = []
    for candidate in sorted(candidates, key=_preference_rank):
        if candidate.label not in labels:
            labels.append(candidate.label)
    return labels


def choose_gguf(files: Sequence[HubFile], tag: str, repo: str) -> GGUFChoice:
    """Resolve ``tag`` against a repository's files (see the module docstring).

    Raises :class:`RemoteNotFoundError` when nothing matches, naming what exists.
    """
    candidates = _candidates(files)
    if not candidates:
        raise RemoteNotFoundError(
            f"hf.co/{repo} has no GGUF model files; localllm runs GGUF models only"
        )
    quants = ", ".join(_available_quants(candidates))

    if tag.lower().endswith(".gguf"):
        for exact in (True, False):
            for candidate in candidates:
                for hub_file in candidate.files:
                    name = hub_file.path.rsplit("/", 1)[-1]
                    if name == tag if exact else name.lower() == tag.lower():
                        return GGUFChoice(
                            candidate.files,
                            candidate.quant,
                            f"using {_describe(candidate)}",
                        )
        names = ", ".join(
            c.files[0].path.rsplit("/", 1)[-1] for c in sorted(candidates, key=_preference_rank)
        )
        raise RemoteNotFoundError(f"hf.co/{repo} has no file {tag}; its GGUF files are: {names}")

    if tag == "latest":
        best = min(candidates, key=_preference_rank)
        if best.quant == DEFAULT_PREFERENCE[0]:
            note = f"using {_describe(best)} ({best.label})"
        else:
            note = (
                f"{DEFAULT_PREFERENCE[0]} is not available, using {best.label} ({_describe(best)})"
            )
        return GGUFChoice(best.files, best.quant, note)

    wanted = _normal(tag)
    for candidate in candidates:
        if candidate.quant == wanted:
            return GGUFChoice(
                candidate.files, candidate.quant, f"using {_describe(candidate)} ({wanted})"
            )
    raise RemoteNotFoundError(
        f"hf.co/{repo} has no {tag} quantization; available: {quants} "
        f"(pull one with hf.co/{repo}:<quant>)"
    )


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def choose_projector(files: Sequence[HubFile], model: GGUFChoice) -> tuple[HubFile, str] | None:
    """The vision projector (``mmproj*.gguf``) to pull with ``model``, and a note saying which.

    Only projectors in the model's folder count. The one whose precision matches the model's
    quant wins (a Q8_0 model with ``mmproj-Q8_0.gguf``), else F16 (what most repositories
    ship, and llama.cpp's default), else the first by name.
    """
    folder = _folder(model.files[0].path)
    projectors = sorted(
        (
            f
            for f in files
            if _folder(f.path) == folder
            and f.path.rsplit("/", 1)[-1].lower().endswith(".gguf")
            and "mmproj" in f.path.rsplit("/", 1)[-1].lower()
        ),
        key=lambda f: f.path,
    )
    if not projectors:
        return None
    for wanted, why in ((model.quant, "matches the model"), ("F16", "F16")):
        if wanted is None:
            continue
        for hub_file in projectors:
            if quant_of(hub_file.path) == wanted:
                name = hub_file.path.rsplit("/", 1)[-1]
                return hub_file, f"using vision projector {name} ({why})"
    first = projectors[0]
    return first, f"using vision projector {first.path.rsplit('/', 1)[-1]}"
