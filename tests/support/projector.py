"""A small random-weight vision projector (an ``mmproj`` GGUF) for the packaged Gemma 3 270M.

No vision model is on PyPI, so the image tests build one with the ``gguf`` package: projector type
``gemma3`` as llama.cpp's libmtmd reads it (``tools/mtmd/clip.cpp``: a SigLIP-style vision tower —
patch embedding, learned positions, pre-norm transformer blocks, a final norm — then Gemma 3's
average pooling, ``mm.soft_emb_norm`` and ``mm.input_projection`` into the text model's 640-wide
embedding). One 64-wide layer on 112 × 112 images: 8 × 8 patches of 14 pixels, pooled 2 × 2 into
16 image tokens. Its answers mean nothing; every part of the path runs for real, and a fixed seed
makes the file the same on every machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEXT_WIDTH = 640  # Gemma 3 270M's embedding width
WIDTH = 64
FFN = 128
HEADS = 2
IMAGE_SIZE = 112
PATCH = 14
MERGE = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH // MERGE) ** 2  # 16


def write(path: Path, seed: int = 0) -> Path:
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    patches = (IMAGE_SIZE // PATCH) ** 2
    tensors = {
        "v.patch_embd.weight": normal(WIDTH, 3, PATCH, PATCH, scale=0.05),
        "v.patch_embd.bias": normal(WIDTH),
        "v.position_embd.weight": normal(patches, WIDTH),
        "v.post_ln.weight": np.ones(WIDTH, np.float32),
        "v.post_ln.bias": np.zeros(WIDTH, np.float32),
        "mm.soft_emb_norm.weight": np.ones(WIDTH, np.float32),
        "mm.input_projection.weight": normal(WIDTH, TEXT_WIDTH, scale=0.5),
    }
    block = "v.blk.0."
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors[f"{block}{name}.weight"] = normal(WIDTH, WIDTH, scale=0.1)
        tensors[f"{block}{name}.bias"] = normal(WIDTH)
    for name in ("ln1", "ln2"):
        tensors[f"{block}{name}.weight"] = np.ones(WIDTH, np.float32)
        tensors[f"{block}{name}.bias"] = np.zeros(WIDTH, np.float32)
    tensors[f"{block}ffn_up.weight"] = normal(FFN, WIDTH, scale=0.1)
    tensors[f"{block}ffn_up.bias"] = normal(FFN)
    tensors[f"{block}ffn_down.weight"] = normal(WIDTH, FFN, scale=0.1)
    tensors[f"{block}ffn_down.bias"] = normal(WIDTH)

    writer = GGUFWriter(path, "clip")
    writer.add_string("general.name", "llmrun test projector (random weights)")
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FFN)
    writer.add_uint32("clip.vision.block_count", 1)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", TEXT_WIDTH)
    writer.add_uint32("clip.vision.projector.scale_factor", MERGE)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
