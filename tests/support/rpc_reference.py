"""Greedy text from raw llama-cpp-python, every layer here, weight repacking off (llama.cpp's note for
comparing with RPC: workers compute on plain weights). Run as a script so ``LLAMA_CPP_LIB_PATH`` applies.

Usage: python reference.py MODEL PROMPT MAX_TOKENS
"""

from __future__ import annotations

import sys

import llama_cpp.llama_cpp as native
from llama_cpp import Llama

original = native.llama_model_default_params


def _defaults():  # type: ignore[no-untyped-def]
    params = original()
    params.use_extra_bufts = False  # no repacked (or AMX) weights
    return params


native.llama_model_default_params = _defaults
model, prompt, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = Llama(model_path=model, n_ctx=512, n_threads=2, flash_attn=True, verbose=False)  # flash attention: as llmrun
out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0)
sys.stdout.write(out["choices"][0]["text"])  # type: ignore[index]
