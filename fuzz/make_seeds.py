"""Write the seed corpora (``fuzz/corpus/<harness>/``) from the crafted inputs the tests build.

Run once after changing a seed: ``python fuzz/make_seeds.py [HARNESS …]``; the files are committed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fuzz.harness import SEPARATOR  # noqa: E402
from tests.support import ggufbuild, modelfiles  # noqa: E402
from tests.unit import test_template  # noqa: E402


def built(metadata: dict[str, object], tensors: list[tuple[str, tuple[int, ...], int]]) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        return ggufbuild.write(Path(folder) / "m.gguf", metadata, tensors).read_bytes()


def gguf_seeds() -> dict[str, bytes]:
    from gguf import GGUFWriter

    template = test_template.QWEN3_REASONING
    seeds = {
        "minimal": ggufbuild.header({"general.architecture": "llama"}),
        "gemma-like": built(
            {
                "general.architecture": "gemma3",
                "general.name": "tiny",
                "gemma3.block_count": 2,
                "gemma3.context_length": 512,
                "gemma3.embedding_length": 64,
                "gemma3.attention.head_count": 2,
                "gemma3.attention.head_count_kv": 1,
                "gemma3.attention.sliding_window": 16,
                "tokenizer.chat_template": template,
                "tokenizer.chat_template.tool_use": test_template.TOOLS,
                "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b"],
            },
            [("token_embd.weight", (64, 4), 1), ("blk.0.attn_q.weight", (64, 8), 8)],
        ),
    }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "w.gguf"
        writer = GGUFWriter(path, "llama")
        writer.add_context_length(256)
        writer.add_block_count(1)
        writer.add_string("tokenizer.chat_template", test_template.CHATML)
        writer.add_array("tokenizer.ggml.scores", [0.5, 1.5])
        import numpy as np

        writer.add_tensor("output.weight", np.zeros((4, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        seeds["gguf-writer"] = path.read_bytes()
    return seeds


def imatrix_seeds() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as folder:
        entries = {"blk.0.attn_q.weight": (4, [4.0, 8.0]), "output.weight": (0, [1.0])}
        legacy = modelfiles.legacy_imatrix(Path(folder) / "m.dat", entries).read_bytes()
        return {"legacy": legacy, "gguf": modelfiles.gguf_imatrix(Path(folder) / "m.gguf").read_bytes()}


def mlx_seeds() -> dict[str, bytes]:
    config = {**modelfiles.GEMMA3_CONFIG, "quantization": {"bits": 4, "group_size": 64}}
    named = {"chat_template": [{"name": "default", "template": "x"}, {"name": "tool_use", "template": "y"}]}
    with tempfile.TemporaryDirectory() as folder:
        tensors = {"a.weight": ("BF16", [4, 8]), "b.weight": ("F32", [2, 2])}
        weights = modelfiles.safetensors(Path(folder) / "model.safetensors", tensors).read_bytes()
    return {
        "gemma": SEPARATOR.join([json.dumps(config).encode(), json.dumps(named).encode(), weights]),
        "plain": SEPARATOR.join([b'{"model_type": "llama", "vocab_size": 8}', b"", weights]),
    }


def ollama_seeds() -> dict[str, bytes]:
    params = json.dumps({"temperature": 0.7, "stop": ["<|im_end|>"], "num_ctx": 4096, "num_predict": -2}).encode()
    manifest = {
        "schemaVersion": 2,
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "0" * 64, "size": 24},
            {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + "1" * 64},
        ],
    }
    return {
        "named-layers": SEPARATOR.join([b"T", params, b"You are helpful."]),
        "raw-manifest": SEPARATOR.join([json.dumps(manifest).encode(), params, b""]),
    }


def chat_seeds() -> dict[str, bytes]:
    record = {
        "version": 1,
        "model": "smollm2:135m",
        "template": "the model's own (embedded)",
        "system": "Be brief.",
        "params": {"temperature": 0.2, "max_tokens": 64, "stop": ["\n\n"], "seed": 7},
        "saved": "2026-12-03T17:00:00+0000",
        "messages": [
            {"role": "user", "content": "Hi", "interrupted": False},
            {"role": "assistant", "content": "Hello!", "interrupted": False, "reasoning": "greet"},
        ],
    }
    return {"saved": json.dumps(record, indent=2).encode()}


def batch_seeds() -> dict[str, bytes]:
    lines = [
        {"id": "a", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.2, "seed": 1},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {"prompt": "Name a city", "schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"prompt": "JSON please", "response_format": {"type": "json_object"}},
    ]
    return {
        "jsonl": "\n".join(json.dumps(line) for line in lines).encode() + b"\n",
        "text": b"The capital of France is\nOnce upon a time\n\n",
    }


def toml_seeds() -> dict[str, bytes]:
    packaged = (HERE.parent / "llmrun" / "models.toml").read_bytes()
    user = b"""default = "mine"
[models.mine]
gguf = { repo = "owner/repo", files = { Q8_0 = "m-q8_0.gguf" } }
context = 2048
template = "{{ messages }}"
[models.mine.defaults]
temperature = 0.3
stop = ["</s>"]
"""
    return {"packaged": packaged, "user": user}


def template_seeds() -> dict[str, bytes]:
    messages = [b"You are terse.", b"Hello <|im_end|>", b"<think>x</think>Hi", b"Thanks"]
    return {
        name: SEPARATOR.join([text.encode(), *messages])
        for name, text in test_template.TEMPLATES.items()
        if len(text) < 4000
    }


def image_seeds() -> dict[str, bytes]:
    from tests.support import imagefiles

    return imagefiles.headers()


def decode_seeds() -> dict[str, bytes]:
    from tests.support import imagefiles

    return imagefiles.decodable()


SEEDS = {
    "gguf_header": gguf_seeds,
    "imatrix": imatrix_seeds,
    "mlx_header": mlx_seeds,
    "ollama_manifest": ollama_seeds,
    "saved_chat": chat_seeds,
    "batch_input": batch_seeds,
    "models_toml": toml_seeds,
    "chat_template": template_seeds,
    "image_header": image_seeds,
    "image_decode": decode_seeds,
}


def main(only: list[str]) -> None:
    for harness, build in SEEDS.items():
        if only and harness not in only:
            continue
        folder = HERE / "corpus" / harness
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, data in build().items():
            (folder / f"{name}-{hashlib.sha1(data).hexdigest()[:8]}").write_bytes(data)
        print(f"{harness}: {len(list(folder.iterdir()))} seeds")


if __name__ == "__main__":
    main(sys.argv[1:])  # the harnesses named, or every one
