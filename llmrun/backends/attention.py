"""Whether llama.cpp computes attention with its flash-attention kernel, model by model.

llama.cpp's own tools turn flash attention on wherever a backend has it (their default,
``auto``); llama-cpp-python leaves it off. Neither is right on a CPU for every model: the CPU
kernel walks the KV cache one position at a time per head, with an online-softmax update at
each, so its cost per position is spread over the head dimension. Measured greedy decode on a
2-core x86 VM (``benchmarks/bench_spec.py``'s RAG prompt repeated to length, alternating):

- head dimension 64 (SmolLM2-135M): 1.35x slower at 256 tokens of context, 1.44x at 512,
  2.0x at 2,048 than without it;
- head dimension 256 (Gemma 3 270M): 2-11% faster at 16 to 2,048 tokens, and 8 streams in one
  batch 15% faster (``benchmarks/bench_serve.py``).

So it is off for models whose heads are 64 wide or narrower, and on otherwise (where it was
on before, unmeasured here); on whenever the KV cache is quantized (llama.cpp needs it for a
quantized V cache) or layers run on a GPU or an RPC worker (whose kernels are built for it).
"""

from __future__ import annotations

NARROW_HEAD = 64  # head dimensions up to this decode faster without flash attention on a CPU
# the words for LoadParams.flash_attn (None: llmrun's choice, below), as --flash-attn takes and shows them
CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def word(flash_attn: bool | None) -> str:
    """``LoadParams.flash_attn`` as its word (auto, on, off)."""
    return next(name for name, value in CHOICES.items() if value is flash_attn)


def flash_attention(head_dim: int | None, kv_type: str, offloaded: bool) -> bool:
    """Flash attention for a model with heads ``head_dim`` wide (None: unknown), a KV cache of
    ``kv_type`` elements, and (``offloaded``) layers on a GPU or RPC worker."""
    if kv_type != "f16" or offloaded:
        return True
    return head_dim is None or head_dim > NARROW_HEAD
