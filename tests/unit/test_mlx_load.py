"""The MLX tokenizer kept per process: by the contents of the files it is read from, so a copy of a model
(quantized or converted here, pulled again) does not read Gemma's 33 MB tokenizer.json again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from llmrun.backends import mlx_load


def model_dir(folder: Path, template: str = "{{ x }}", model_type: str = "gemma3_text") -> Path:
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text('{"model": "a vocabulary"}')
    (folder / "tokenizer_config.json").write_text(f'{{"chat_template": "{template}"}}')
    (folder / "config.json").write_text(f'{{"model_type": "{model_type}", "quantization": {{"bits": 4}}}}')
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_copies_share_one_tokenizer_and_a_change_reads_again(tmp_path: Path) -> None:
    loads: list[Path] = []

    def load(path: Path, eos_token_ids: Any = None) -> Any:
        loads.append(path)
        return SimpleNamespace(_tokenizer=object())

    mlx_load._TOKENIZERS.clear()
    original = model_dir(tmp_path / "m16")
    copy = tmp_path / "m4"
    shutil.copytree(original, copy)
    os.utime(copy / "tokenizer.json", (1, 1))  # another time: a copy, not the same file
    (copy / "config.json").write_text('{"model_type": "gemma3_text", "quantization": {"bits": 8}}')
    first = mlx_load.kept_tokenizer(original, None, load)
    assert mlx_load.kept_tokenizer(copy, None, load) is first and loads == [original]
    assert mlx_load.kept_tokenizer(copy, (1,), load) is not first  # another end-of-turn list
    changed = model_dir(tmp_path / "other", template="{{ y }}")
    assert mlx_load.kept_tokenizer(changed, None, load) is not first
    kind = model_dir(tmp_path / "llama", model_type="llama")  # config.json's model_type picks the class
    assert mlx_load.kept_tokenizer(kind, None, load) is not first
    assert len(loads) == 4
