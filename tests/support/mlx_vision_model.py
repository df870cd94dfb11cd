"""A small Gemma 3 vision model in mlx-vlm's layout, for the MLX image tests.

No MLX vision model is small enough to fetch in tests, so this builds one the way mlx-community's
Gemma 3 vision repos are laid out (``model_type`` ``gemma3``: ``language_model.*``, ``vision_tower.*``,
``multi_modal_projector.*`` in one safetensors file, a ``Gemma3Processor`` and its image processor):
the text half is the packaged Gemma 3 270M (converted to MLX by the tests), the vision half a random
one-layer 64-wide SigLIP tower on 112-pixel images, pooled to 16 image tokens, as the GGUF tests'
projector (``tests/support/projector.py``). Gemma 3 270M's vocabulary has no ``<image_soft_token>``;
the model uses ``<unused0>`` in its place. Its answers mean nothing; every part of the path runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

IMAGE_SIZE = 112
PATCH = 14
IMAGE_TOKENS = 16
WIDTH = 64
IMAGE_TOKEN = "<unused0>"  # id 6
# what Gemma3Processor puts for each image: "\n\n" <start_of_image> 16 × image token <end_of_image> "\n\n"
VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": WIDTH,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH,
    "num_channels": 3,
    "layer_norm_eps": 1e-6,
}


def write(text_model: Path, out: Path, seed: int = 0) -> Path:
    """The vision model at ``out``, from ``text_model`` (an MLX Gemma 3 text directory)."""
    from llmrun.formats.mlx_runtime import prepare_mlx

    prepare_mlx()  # before mlx's first import in this process, as llmrun does (its float32 products need it)
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.gemma3 import Model, ModelConfig, TextConfig, VisionConfig

    text = json.loads((text_model / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = json.loads((text_model / "tokenizer.json").read_text())
    image_token_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == IMAGE_TOKEN)
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {**text, "mm_tokens_per_image": IMAGE_TOKENS},
        "vision_config": VISION,
        "mm_tokens_per_image": IMAGE_TOKENS,
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "image_token_index": image_token_id,
        "hidden_size": text["hidden_size"],
        "vocab_size": text["vocab_size"],
        "eos_token_id": [1, 106],
        "bos_token_id": 2,
        "pad_token_id": 0,
    }
    for name in ("quantization", "quantization_config"):
        if name in text:
            config[name] = text[name]
    weights = {f"language_model.{k}": v for k, v in mx.load(str(_safetensors(text_model))).items()}
    model_config = ModelConfig.from_dict(config)
    model_config.text_config = TextConfig.from_dict(config["text_config"])
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    model = Model(model_config)
    rng = np.random.default_rng(seed)
    vision = {"vision_tower": model.vision_tower.parameters()}
    vision["multi_modal_projector"] = model.multi_modal_projector.parameters()
    for name, value in tree_flatten(vision):
        norm = "norm" in name.rsplit(".", 2)[-2] and name.endswith(".weight")  # a norm's scale: ones, the rest random
        base = np.ones(value.shape) if norm else rng.normal(0, 0.05, value.shape)
        weights[name] = mx.array(base.astype(np.float32)).astype(mx.bfloat16)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for name in ("tokenizer.json", "tokenizer.model"):
        if (text_model / name).exists():
            shutil.copyfile(text_model / name, out / name)
    tokenizer_config = json.loads((text_model / "tokenizer_config.json").read_text())
    tokenizer_config["extra_special_tokens"] = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": IMAGE_TOKEN,
    }
    tokenizer_config["processor_class"] = "Gemma3Processor"
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": "Gemma3Processor", "image_seq_length": IMAGE_TOKENS})
    )
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "do_pan_and_scan": False,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "rescale_factor": 1 / 255,
                "resample": 2,
                "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            }
        )
    )
    (out / "config.json").write_text(json.dumps(config, indent=1))  # last: a whole directory has it
    return out


def _safetensors(folder: Path) -> Path:
    found = sorted(folder.glob("*.safetensors"))
    if len(found) != 1:
        raise AssertionError(f"expected one safetensors file in {folder}, found {len(found)}")
    return found[0]
