"""A model's memory layout from its GGUF, placed on devices as llama.cpp places it.

:class:`ModelLayout` holds what the plan needs per layer: each repeating layer's weight bytes,
the token embedding (always on the host), the output layer, and the KV bytes per cell of each
layer at the cache's element type (sliding-window layers keep only their window).
:func:`place_layers` reproduces llama.cpp's assignment of layers to devices
(``llama_model::load_tensors``), :func:`place` the weights and KV that follow from it, and
:func:`estimate` a whole :data:`~localllm.daemon.memory.plan.Measure` from the GGUF alone (compute
buffers
guessed) for the planner's unit tests and wherever llama.cpp cannot be asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localllm.gguf_info import KV_BYTES_PER_ELEMENT, GGUFInfo

from .plan import Device, DeviceUse, Measure, Trial

__all__ = ["ModelLayout", "estimate", "layout_from_gguf", "place", "place_layers"]


def place_layers(n_layer: int, n_gpu_layers: int, gpus: Sequence[Device], host: str) -> list[str]:
    """The device of each layer, as llama.cpp assigns them (``llama_model::load_tensors``):
    index ``n_layer`` is the output layer. The last ``n_gpu_layers`` of the ``n_layer + 1``
    go to the GPUs, split in proportion to their free memory (llama.cpp's default split)."""
    placed = [host] * (n_layer + 1)
    if not gpus or n_gpu_layers <= 0:
        return placed
    offloaded = min(n_gpu_layers, n_layer + 1)
    start = n_layer + 1 - offloaded
    weights = [max(g.free, 0) for g in gpus]
    if sum(weights) <= 0:
        weights = [1] * len(gpus)
    bounds, running = [], 0.0
    for w in weights:
        running += w
        bounds.append(running / sum(weights))
    for layer in range(start, n_layer + 1):
        position = (layer - start) / offloaded
        index = next((i for i, b in enumerate(bounds) if position < b), len(gpus) - 1)
        placed[layer] = gpus[index].name
    return placed


@dataclass(frozen=True)
class ModelLayout:
    """A model's sizes as its GGUF gives them: what the plan places layer by layer."""

    n_layer: int
    """Repeating layers."""
    layer_weights: tuple[int, ...]
    """Bytes of each repeating layer's tensors."""
    input_weights: int
    """Bytes of tensors outside the layers that stay on the host (token embeddings...)."""
    output_weights: int
    """Bytes of the output layer (its norm and head)."""
    kv_per_cell: tuple[int, ...]
    """Bytes of K and V per cell for each layer, at the KV cache's element type."""
    tied_output: int = 0
    """Bytes of the token embedding that doubles as the head (no ``output.weight``): a copy
    only where the output layer leaves the host (on the host the one tensor serves both)."""
    swa_cells: int = 0
    """Sliding-window layers keep this many cells per sequence (0: none are)."""
    swa_layers: tuple[bool, ...] = ()
    """Which layers use the sliding window."""
    n_vocab: int = 0
    """Vocabulary size (the logits of a batch)."""
    n_embd: int = 0
    """Hidden size."""
    n_ff: int = 0
    """Feed-forward size."""
    n_head: int = 0
    """Attention heads."""
    n_ctx_train: int = 0
    """Trained context length."""

    @property
    def weights(self) -> int:
        """Bytes of all weights (the output counted once)."""
        return self.input_weights + sum(self.layer_weights) + self.output_weights

    def kv_bytes(self, layer: int, cells: int, n_seq: int, n_ubatch: int) -> int:
        """KV bytes of one layer for ``cells`` cells (a window layer holds fewer)."""
        per_cell = self.kv_per_cell[layer] if layer < len(self.kv_per_cell) else 0
        if self.swa_cells and layer < len(self.swa_layers) and self.swa_layers[layer]:
            cells = min(cells, self.swa_cells * n_seq + n_ubatch)
        return per_cell * cells


def _layer_of(name: str) -> int | None:
    if name.startswith("blk."):
        number = name.split(".", 2)[1]
        if number.isdigit():
            return int(number)
    return None


def _swa_pattern(info: GGUFInfo, n_layer: int) -> tuple[bool, ...]:
    pattern = info.metadata.get(f"{info.architecture}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return tuple(bool(p) for p in pattern[:n_layer])
    if isinstance(pattern, int) and pattern > 1:
        # llama.cpp's convention: in every group of `pattern` layers, the last one is dense
        return tuple((il + 1) % pattern != 0 for il in range(n_layer))
    return ()


def layout_from_gguf(parts: Sequence[GGUFInfo], kv_cache_type: str = "f16") -> ModelLayout:
    """The :class:`ModelLayout` of a model from its GGUF parts (one unless it is split)."""
    info = parts[0]
    n_layer = info.block_count or 0
    layer_weights = [0] * n_layer
    input_weights = output_weights = 0
    names: set[str] = set()
    token_embd = 0
    for part in parts:
        for tensor in part.tensors:
            names.add(tensor.name)
            layer = _layer_of(tensor.name)
            if layer is not None and layer < n_layer:
                layer_weights[layer] += tensor.n_bytes
            elif tensor.name.startswith(("output.", "output_norm.")):
                output_weights += tensor.n_bytes
            else:
                input_weights += tensor.n_bytes
                if tensor.name.startswith("token_embd."):
                    token_embd += tensor.n_bytes
    tied = token_embd if "output.weight" not in names else 0
    meta = info.metadata
    arch = info.architecture
    n_head = info.head_count or 1
    n_embd = info.embedding_length or 0
    key_length = meta.get(f"{arch}.attention.key_length") or (n_embd // n_head if n_head else 0)
    value_length = meta.get(f"{arch}.attention.value_length") or key_length
    heads = meta.get(f"{arch}.attention.head_count_kv", info.head_count or 0)
    per_layer = list(heads) if isinstance(heads, list) else [int(heads or 0)] * n_layer
    element = KV_BYTES_PER_ELEMENT[kv_cache_type]
    kv_per_cell = tuple(int(h * (key_length + value_length) * element) for h in per_layer[:n_layer])
    window = meta.get(f"{arch}.attention.sliding_window")
    swa_layers = _swa_pattern(info, n_layer) if isinstance(window, int) and window > 0 else ()
    return ModelLayout(
        n_layer=n_layer,
        layer_weights=tuple(layer_weights),
        input_weights=input_weights,
        output_weights=output_weights,
        tied_output=tied,
        kv_per_cell=kv_per_cell,
        swa_cells=int(window) if swa_layers and isinstance(window, int) else 0,
        swa_layers=swa_layers,
        n_vocab=info.vocab_size or 0,
        n_embd=n_embd,
        n_ff=info.feed_forward_length or 0,
        n_head=n_head,
        n_ctx_train=info.context_length or 0,
    )


def place(
    layout: ModelLayout, trial: Trial, devices: Sequence[Device], n_ubatch: int
) -> list[DeviceUse]:
    """Weights and KV of ``trial`` on each device (no compute buffers): layer by layer, as
    llama.cpp places them; a layer's KV lives with it."""
    host = next(d.name for d in devices if d.is_host)
    gpus = [d for d in devices if not d.is_host]
    uses = {d.name: DeviceUse(d.name) for d in devices}
    uses[host].weights += layout.input_weights
    where = place_layers(layout.n_layer, trial.n_gpu_layers, gpus, host)
    for layer, device in enumerate(where):
        use = uses[device]
        use.layers += 1
        if layer == layout.n_layer:
            use.weights += layout.output_weights + (layout.tied_output if device != host else 0)
            continue
        use.weights += layout.layer_weights[layer]
        use.kv += layout.kv_bytes(layer, trial.cells, trial.n_slots + 1, n_ubatch)
    return list(uses.values())


def estimate(
    layout: ModelLayout,
    devices: Sequence[Device],
    *,
    n_batch: int = 512,
    flash_attention: str = "auto",
    host_other: int = 0,
) -> Measure:
    """A :data:`Measure` from the GGUF alone. Compute buffers are an upper-bound guess (a
    batch's logits and activations, plus the attention scores unless flash attention is on);
    llama.cpp's ``no_alloc`` measure replaces them with its own figures."""
    host = next(d.name for d in devices if d.is_host)

    def measure(trial: Trial) -> list[DeviceUse]:
        n_ubatch = max(n_batch, trial.n_slots + 1)
        uses = place(layout, trial, devices, n_ubatch)
        compute = n_ubatch * (layout.n_vocab + 4 * layout.n_embd + 2 * layout.n_ff) * 4
        if flash_attention != "on":
            compute += n_ubatch * trial.cells * layout.n_head * 4
        by_name = {u.device: u for u in uses}
        # The graph's big buffers sit with the output layer; the host keeps the inputs'.
        head = by_name[
            place_layers(
                layout.n_layer, trial.n_gpu_layers, [d for d in devices if not d.is_host], host
            )[-1]
        ]
        head.compute += compute
        if head.device != host:
            by_name[host].compute += n_ubatch * layout.n_embd * 4 * 4
        by_name[host].other += host_other
        return uses

    return measure
