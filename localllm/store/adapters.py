"""LoRA adapters in the store: what an adapter file is, and whether it fits its base model.

An adapter is a GGUF that llama.cpp's ``convert_lora_to_gguf.py`` writes (``general.type``
``adapter``, ``adapter.type`` ``lora``, ``adapter.lora.alpha``, a ``<tensor>.lora_a`` and a
``<tensor>.lora_b`` for each weight it changes). It is stored as a layer of Ollama's adapter
media type (Modelfile ``ADAPTER path [scale]``), its scale in the layer's annotations.

:func:`check_adapter` refuses at create time what llama.cpp's ``llama_adapter_lora_init`` would
refuse at load time (another architecture, a tensor the base lacks, a shape that does not
fit), naming the first tensor at fault in the adapter's own order; a safetensors or PEFT
adapter is refused with the conversion command to run. Only GGUF headers are read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import AdapterError, GGUFError
from ..gguf_info import GGUFInfo, TensorInfo, inspect_gguf
from .manifest import ANNOTATION_SCALE, MEDIA_ADAPTER, Layer, Manifest

__all__ = [
    "CONVERT_COMMAND",
    "AdapterFacts",
    "AdapterSource",
    "ModelAdapter",
    "check_adapter",
    "format_scale",
    "layer_scale",
    "model_adapters",
    "parse_scale",
    "with_scale",
]

CONVERT_COMMAND = (
    "python convert_lora_to_gguf.py --base BASE_MODEL_DIR --outtype f16 --outfile adapter.gguf "
    "ADAPTER_DIR (convert_lora_to_gguf.py is in llama.cpp's repository; BASE_MODEL_DIR is the "
    "base model's Hugging Face folder)"
)
"""How to turn a PEFT (safetensors) adapter into the GGUF adapter localllm and llama.cpp load."""

_SUFFIXES = (".lora_a", ".lora_b")


@dataclass(frozen=True)
class AdapterSource:
    """One adapter for :func:`~localllm.store.models.create_model`: a file or an uploaded blob,
    with the scale it applies at (1.0 unless the Modelfile says otherwise)."""

    file: Path | None = None
    """A GGUF adapter file the creating process reads."""
    digest: str | None = None
    """Or the digest of a blob in the store (uploaded with ``POST /api/blobs``)."""
    scale: float = 1.0
    """How strongly it applies (``ADAPTER path SCALE``); 0 leaves it off unless a request's
    ``adapters`` option turns it on."""
    label: str = ""
    """What messages call it (its file name)."""


@dataclass(frozen=True)
class AdapterFacts:
    """What an adapter's header says, once checked against its base."""

    architecture: str
    """``general.architecture``: the base's."""
    alpha: float
    """``adapter.lora.alpha`` (0: the scale applies as it is, not times alpha / rank)."""
    rank: int
    """The LoRA rank (the inner size of its matrices)."""
    tensors: int
    """Base weights it changes (pairs of lora_a / lora_b)."""
    name: str | None
    """``general.name``, when it has one."""


@dataclass(frozen=True)
class ModelAdapter:
    """One adapter layer of a stored model."""

    digest: str
    """``sha256:<hex>`` of its GGUF blob."""
    path: Path
    """The blob."""
    size: int
    """Bytes of the blob."""
    scale: float
    """The scale it applies at by default."""


def parse_scale(value: object, where: str = "scale") -> float:
    """A finite adapter scale from ``value`` (a number or its text); raises AdapterError."""
    try:
        if isinstance(value, bool):
            raise ValueError
        scale = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AdapterError(f"{where} must be a number, got {value!r}") from None
    if not math.isfinite(scale):
        raise AdapterError(f"{where} must be a finite number, got {value!r}")
    return scale


def format_scale(scale: float) -> str:
    """A scale as Modelfiles and annotations write it (``0.5``, ``1``)."""
    return f"{scale:g}"


def layer_scale(layer: Layer) -> float:
    """An adapter layer's scale (1.0 without the annotation, as Ollama applies adapters)."""
    value = layer.annotation(ANNOTATION_SCALE)
    if value is None:
        return 1.0
    try:
        return parse_scale(value)
    except AdapterError:
        return 1.0


def with_scale(layer: Layer, scale: float) -> Layer:
    """``layer`` annotated with ``scale`` (no annotation for 1.0: the manifest stays
    byte-identical to Ollama's for a plain adapter)."""
    kept = tuple((k, v) for k, v in layer.annotations if k != ANNOTATION_SCALE)
    if scale != 1.0:
        kept += ((ANNOTATION_SCALE, format_scale(scale)),)
    return Layer(layer.media_type, layer.digest, layer.size, kept)


def model_adapters(manifest: Manifest, blob_path: Callable[[str], Path]) -> list[ModelAdapter]:
    """The adapter layers of ``manifest`` in order; ``blob_path`` maps a digest to its file."""
    return [
        ModelAdapter(layer.digest, blob_path(layer.digest), layer.size, layer_scale(layer))
        for layer in manifest.layers_of(MEDIA_ADAPTER)
    ]


def _foreign(path: Path) -> str | None:
    """What a non-GGUF adapter is (a PEFT folder, safetensors, a PyTorch file), or None."""
    if path.is_dir():
        if (path / "adapter_config.json").is_file():
            return "a PEFT adapter folder (adapter_config.json)"
        return "a folder"
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError:
        return None
    if path.suffix == ".safetensors" or (len(head) >= 9 and head[8:9] == b"{"):
        return "a safetensors file"
    if head[:2] == b"PK" or path.suffix in (".bin", ".pt", ".pth"):
        return "a PyTorch checkpoint"
    return None


def _shape(tensor: TensorInfo) -> str:
    return "x".join(str(d) for d in tensor.shape)


def check_adapter(path: Path, base: GGUFInfo | Sequence[GGUFInfo], label: str = "") -> AdapterFacts:
    """Check the adapter at ``path`` against the base model (its GGUF's header, or every part
    of a split one) as llama.cpp will when it loads it; raises :class:`AdapterError` naming
    the adapter (``label``, else its file name) and the first tensor at fault."""
    parts = [base] if isinstance(base, GGUFInfo) else list(base)
    what = f"adapter {label or path.name}"
    foreign = _foreign(path)
    if foreign is not None:
        raise AdapterError(
            f"{what} is {foreign}, not a GGUF LoRA adapter; convert it first: {CONVERT_COMMAND}"
        )
    try:
        info = inspect_gguf(path)
    except GGUFError as exc:
        raise AdapterError(f"{what}: {exc}") from None
    meta = info.metadata
    kind = meta.get("general.type")
    if kind != "adapter":
        raise AdapterError(
            f"{what} is not a LoRA adapter: its general.type is {kind!r}, not 'adapter' "
            "(a model goes in FROM)"
        )
    adapter_type = meta.get("adapter.type")
    if adapter_type != "lora":
        raise AdapterError(
            f"{what} is a {adapter_type!r} adapter; only LoRA adapters (adapter.type 'lora') "
            "are supported"
        )
    architecture = parts[0].architecture
    if info.architecture != architecture:
        raise AdapterError(
            f"{what} is for the {info.architecture!r} architecture but the base model is "
            f"{architecture!r}"
        )
    alpha = meta.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise AdapterError(f"{what}: adapter.lora.alpha is not a number ({alpha!r})")
    weights = {t.name: t for part in parts for t in part.tensors}
    pairs: dict[str, dict[str, TensorInfo]] = {}
    for tensor in info.tensors:
        name = tensor.name
        suffix = next((s for s in _SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            if name.endswith("_norm.weight"):
                continue  # llama.cpp skips norm vectors in adapters
            raise AdapterError(
                f"{what}: tensor {name!r} is neither a .lora_a nor a .lora_b (not a LoRA "
                "adapter llama.cpp can load)"
            )
        pairs.setdefault(name[: -len(suffix)], {})[suffix] = tensor
    if not pairs:
        raise AdapterError(f"{what} holds no LoRA tensors (.lora_a / .lora_b)")
    rank = 0
    for target, pair in pairs.items():
        a, b = pair.get(".lora_a"), pair.get(".lora_b")
        if a is None or b is None:
            missing = ".lora_a" if a is None else ".lora_b"
            raise AdapterError(
                f"{what}: tensor {target + missing!r} is missing (pairs go together)"
            )
        weight = weights.get(target)
        if weight is None:
            raise AdapterError(
                f"{what}: tensor {a.name!r} changes {target!r}, which the base model does not "
                "have (an adapter made for another base model?)"
            )
        problem = _misfit(target, weight, a, b)
        if problem is not None:
            raise AdapterError(f"{what}: {problem} (an adapter made for another base model?)")
        rank = max(rank, b.shape[0])
    return AdapterFacts(
        architecture=info.architecture,
        alpha=float(alpha),
        rank=rank,
        tensors=len(pairs),
        name=info.name,
    )


def _misfit(target: str, weight: TensorInfo, a: TensorInfo, b: TensorInfo) -> str | None:
    """Why ``a`` and ``b`` do not fit ``weight`` (llama.cpp's own shape rules), or None."""
    if len(a.shape) != 2 or len(b.shape) != 2 or len(weight.shape) < 2:
        return f"tensor {a.name!r} is {_shape(a)}, {b.name!r} {_shape(b)}: LoRA matrices are 2-D"
    if target.endswith("token_embd.weight"):
        # A and B are flipped for the embedding (llama.cpp's llm_build_inp_embd).
        if weight.shape[0] != b.shape[1]:
            return (
                f"tensor {b.name!r} is {_shape(b)} but {target!r} is {_shape(weight)}: its "
                f"second dimension must be {weight.shape[0]}"
            )
        if weight.shape[1] != a.shape[1]:
            return (
                f"tensor {a.name!r} is {_shape(a)} but {target!r} is {_shape(weight)}: its "
                f"second dimension must be {weight.shape[1]}"
            )
        return None
    if weight.shape[0] != a.shape[0]:
        return (
            f"tensor {a.name!r} is {_shape(a)} but {target!r} is {_shape(weight)}: its first "
            f"dimension must be {weight.shape[0]}"
        )
    if weight.shape[1] != b.shape[1]:
        return (
            f"tensor {b.name!r} is {_shape(b)} but {target!r} is {_shape(weight)}: its second "
            f"dimension must be {weight.shape[1]}"
        )
    if a.shape[1] != b.shape[0]:
        return (
            f"tensor {a.name!r} is {_shape(a)} and {b.name!r} {_shape(b)}: their ranks differ "
            "(lora_a must be stored transposed)"
        )
    return None
