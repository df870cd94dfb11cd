"""llama.cpp's KV cells of one sequence, to bytes and back (the KV store's payload on GGUF).

``llama_state_seq_get_data`` serialises the cells of a sequence (their positions, K and V of every
layer, in the cache's own type: a q8_0 cache is kept as q8_0); ``llama_state_seq_set_data`` puts
them into a sequence of a context made with the same model and settings. They are the very cells
the saving process computed, so a restored prefix gives the logits that process would have given.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from llmrun.backends.base import LoadParams
from llmrun.models.kv_store import KvStore


def seq_state(ctx: Any, seq: int) -> bytes:
    """The cells of sequence ``seq`` of the llama.cpp context ``ctx`` (a ``llama_context`` pointer)."""
    import llama_cpp

    size = int(llama_cpp.llama_state_seq_get_size(ctx, seq))
    buffer = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, seq))
    return bytes(memoryview(buffer)[:written])


def set_seq_state(ctx: Any, seq: int, payload: bytes | bytearray) -> bool:
    """Put ``payload`` (from :func:`seq_state`) into sequence ``seq``; False when llama.cpp refuses it
    (no room, another model's layout): the sequence is then left empty. A ``bytearray`` is read in place."""
    import llama_cpp

    array = ctypes.c_uint8 * len(payload)
    buffer = array.from_buffer(payload) if isinstance(payload, bytearray) else array.from_buffer_copy(payload)
    if int(llama_cpp.llama_state_seq_set_data(ctx, buffer, len(payload), seq)) == 0:
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), seq, -1, -1)
        return False
    return True


def kv_settings(params: LoadParams, flash_attn: bool, swa_full: bool) -> dict[str, Any]:
    """What a GGUF model's key in the KV store holds besides its file: what changes the cells' bytes."""
    import llama_cpp

    return {
        "backend": "gguf",
        "engine": f"llama-cpp-python {llama_cpp.__version__}",
        "kv_type": params.kv_type,
        "flash_attn": flash_attn,
        "swa_full": swa_full,
        "rpc": bool(params.rpc),
    }


def restore_into(
    store: KvStore, ctx: Any, seq: int, ids: Sequence[int], held: int, *, prompt: bool = True
) -> tuple[list[int], int] | None:
    """Fill sequence ``seq`` from the store's best entry for ``ids`` (a prompt, whose last token is evaluated
    for its logits; else a prefix, all of which may come from the store) when it spares more than the
    ``held`` tokens the cells already have: the entry's tokens (the cells now hold them all) and how many
    of ``ids`` they spare. None when nothing better was found (the cells are as they were); no tokens
    when llama.cpp refused the entry's cells (the sequence is empty then)."""
    found = store.lookup(ids, better_than=held, prompt=prompt)
    if found is None:
        return None
    entry, usable = found
    payload = store.load(entry)
    if payload is None:
        return None
    import llama_cpp

    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), seq, -1, -1)
    if not set_seq_state(ctx, seq, payload):
        return [], 0
    return list(entry.tokens), usable


def keep(store: KvStore, ctx: Any, seq: int, tokens: Sequence[int], *, replace_shorter: bool = False) -> None:
    """Keep the cells of sequence ``seq`` (holding ``tokens``) in the store when it wants them."""
    if store.wanted(tokens):
        store.save(tokens, seq_state(ctx, seq), replace_shorter=replace_shorter)
