"""Flash attention, model by model (llmrun.backends.attention)."""

from __future__ import annotations

import pytest

from llmrun.backends.attention import flash_attention


def test_narrow_heads_on_a_cpu_attend_without_flash_attention() -> None:
    assert flash_attention(64, "f16", offloaded=False) is False  # SmolLM2-135M
    assert flash_attention(32, "f16", offloaded=False) is False
    assert flash_attention(256, "f16", offloaded=False) is True  # Gemma 3 270M
    assert flash_attention(128, "f16", offloaded=False) is True
    assert flash_attention(None, "f16", offloaded=False) is True  # unknown: llama.cpp's own default


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_a_quantized_kv_cache_or_offloaded_layers_always_get_it(kv_type: str) -> None:
    assert flash_attention(64, kv_type, offloaded=False) is True  # llama.cpp needs it for a quantized V cache
    assert flash_attention(64, "f16", offloaded=True) is True
