"""The CLI's words for the parameters core code names (``n_ctx`` → ``--ctx``).

Core errors and warnings mention parameters by field name in backticks; the CLI's
output functions (:mod:`llmrun.cli.render`) word each as the flag that sets it.
The server words operator-level ones as the flags its operator started it with.
"""

from __future__ import annotations

FLAGS = {
    # sampling
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "repeat_penalty": "--repeat-penalty",
    "repeat_last_n": "--repeat-last-n",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "seed": "--seed",
    "max_tokens": "--max-tokens",
    "stop": "--stop",
    "logprobs": "--logprobs",
    "prompt": "PROMPT",
    # loading
    "n_ctx": "--ctx",
    "n_threads": "--threads",
    "n_gpu_layers": "--gpu-layers",
    "kv_type": "--kv-bits",
    "max_kv_size": "--max-kv-size",
    "flash_attn": "--flash-attn",
    "show_special": "--show-special",
    "rpc": "--rpc",
    "rpc_allow_remote": "--rpc-allow-remote",
    "backend": "--backend",
    "parallel": "--parallel",
    "endpoint": "--endpoint",
    "force": "--force",
    "raw": "--raw",
    "draft": "--draft",
    "draft_tokens": "--draft-tokens",
    # images
    "mmproj": "--mmproj",
    "image_max_tokens": "--image-max-tokens",
    # looking inside
    "layer": "--layer",
    # everywhere
    "debug": "--debug",
    "offline": "--offline",
    # retrieval and indexing
    "embed_model": "--embed-model",
    "chunk_tokens": "--chunk-tokens",
    "overlap": "--overlap",
    "k": "-k",
    # quantize, convert, batch
    "bits": "--bits",
    "type": "--type",
    "group_size": "--group-size",
    "imatrix": "--imatrix",
    "allow_requantize": "--allow-requantize",
    "format": "--format",
    "schema": "--schema",
    "grammar": "--grammar",
    "response_format": "response_format",  # a batch line's field
    "tools": "tools",  # the server's field (the CLI offers no tools)
    "name": "--name",
    "output": "-o",
    "text": "--text",
    "no_eval": "--no-eval",
    "resume": "--resume",
}
