"""Write a tiny but real vision projector (``mmproj``) GGUF with ``gguf.GGUFWriter``, and
make small images to feed it.

The projector is LLaVA 1.5's shape (``clip.projector_type = mlp``): a ViT with patch and
position embeddings, ``block_count`` pre-norm blocks (LLaVA reads the features of the second to
last block, so two blocks means one block runs) and the two-layer MLP ``mm.0``/``mm.2`` mapping
into the text model's embedding size. Images are resized to ``image_size`` square, so every
image becomes ``(image_size / patch_size) ** 2`` embeddings: four with the defaults. Weights are
random (seeded); llama.cpp's mtmd loads it and encodes an image in milliseconds.
"""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import numpy as np
from PIL import Image

__all__ = ["image_tokens", "png_bytes", "write_tiny_mmproj"]


def image_tokens(image_size: int = 28, patch_size: int = 14) -> int:
    """How many embeddings (KV cells) one image takes with these projector sizes."""
    return (image_size // patch_size) ** 2


def write_tiny_mmproj(
    path: str | Path,
    *,
    n_embd_text: int = 256,
    n_embd: int = 32,
    n_head: int = 4,
    n_ff: int = 64,
    n_blocks: int = 2,
    image_size: int = 28,
    patch_size: int = 14,
    seed: int = 0,
) -> Path:
    """Write the projector to ``path`` and return it.

    ``n_embd_text`` must be the text model's embedding size (:func:`tiny_gguf.write_tiny_gguf`'s
    ``n_embd``, 256 by default): mtmd refuses a projector whose output does not match.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    n_patches = image_tokens(image_size, patch_size)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("tiny-mmproj")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.block_count", n_blocks)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vector(n: int, value: float | None = None) -> np.ndarray:
        if value is not None:
            return np.full(n, value, dtype=np.float32)
        return (rng.standard_normal(n) * 0.1).astype(np.float32)

    # numpy shape is ggml's ne reversed: the patch conv is ne {patch, patch, 3, n_embd}.
    patch = rng.standard_normal((n_embd, 3, patch_size, patch_size)) / patch_size
    writer.add_tensor("v.patch_embd.weight", patch.astype(np.float32))
    writer.add_tensor("v.patch_embd.bias", vector(n_embd))
    writer.add_tensor("v.position_embd.weight", matrix(n_patches, n_embd))
    for layer in range(n_blocks):
        prefix = f"v.blk.{layer}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{prefix}.{name}.weight", matrix(n_embd, n_embd))
            writer.add_tensor(f"{prefix}.{name}.bias", vector(n_embd))
        writer.add_tensor(f"{prefix}.ln1.weight", vector(n_embd, 1.0))
        writer.add_tensor(f"{prefix}.ln1.bias", vector(n_embd, 0.0))
        writer.add_tensor(f"{prefix}.ln2.weight", vector(n_embd, 1.0))
        writer.add_tensor(f"{prefix}.ln2.bias", vector(n_embd, 0.0))
        writer.add_tensor(f"{prefix}.ffn_up.weight", matrix(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.bias", vector(n_ff))
        writer.add_tensor(f"{prefix}.ffn_down.weight", matrix(n_embd, n_ff))
        writer.add_tensor(f"{prefix}.ffn_down.bias", vector(n_embd))
    # Outputs of the size of the text model's token embeddings (std ~1), so an image's
    # embeddings weigh on the next tokens as much as text does.
    writer.add_tensor("mm.0.weight", matrix(n_embd_text, n_embd))
    writer.add_tensor("mm.0.bias", vector(n_embd_text))
    writer.add_tensor("mm.2.weight", matrix(n_embd_text, n_embd_text) * 2.0)
    writer.add_tensor("mm.2.bias", vector(n_embd_text))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def png_bytes(
    colour: tuple[int, int, int] = (255, 0, 0),
    size: tuple[int, int] = (16, 16),
    *,
    fmt: str = "PNG",
    pattern: bool = False,
) -> bytes:
    """The bytes of a small image file of one ``colour`` (``fmt``: PNG, JPEG, GIF, BMP).

    ``pattern`` draws a diagonal of the inverse colour, so two images of one colour can still
    differ in content.
    """
    image = Image.new("RGB", size, colour)
    if pattern:
        inverse = tuple(255 - c for c in colour)
        for i in range(min(size)):
            image.putpixel((i, i), inverse)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()
