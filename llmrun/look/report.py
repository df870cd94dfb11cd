"""``llmrun look --json``: the documented shape of one forward pass looked into.

::

    {
      "model": str, "architecture": str,
      "layers": int, "heads": int, "kv_heads": int, "embedding_size": int, "vocabulary": int,
      "positions": {"rope": str, "base": float, "sliding_window": int, "text": str},
      "tokens": [{"position": int, "id": int, "text": str, "norm": float}],
      "attention_layers": [int],                 # the layers whose attention was captured
      "attention": [[[[float]]]],                # [layer][head][query][key]: keys 0 … query (later keys
                                                 # are 0 and left out); null for a layer not captured
      "lens": [[{"id": int, "text": str, "prob": float,
                 "top": [{"id": int, "text": str, "prob": float}]}]],   # [layer][position]
      "lens_complete": bool,                     # false: the lens failed its check (see notes): only the
                                             # model's own cells of the last layer are given, the rest null
      "neighbours": {str: [{"id": int, "text": str, "cosine": float}]},
      "seconds": {"capture": float, "lens": float, "embeddings": float},
      "notes": [str]
    }

The lens cell at [layer][position] is the top prediction for the token after ``position``
when the final norm and output head are applied to that layer's output; the last layer is
the model's own distribution, as ``llmrun next`` shows it for the last position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmrun.look.view import Look, positions_line

DIGITS = 5  # attention weights and probabilities are rounded to this many decimals


def to_json(look: Look, text: Callable[[int], str]) -> dict[str, Any]:
    """``text``: a token id's text (the lens and the neighbours name tokens that are not in the prompt)."""
    geometry = look.geometry
    n = len(look.tokens)

    def cell(layer: int, position: int) -> dict[str, Any] | None:
        if not look.lens_shown and (
            layer < geometry.n_layer - 1 or (look.own_known is not None and not look.own_known[position])
        ):
            return None
        ids, probs = look.lens_ids[layer, position], look.lens_probs[layer, position]
        top = [
            {"id": int(i), "text": text(int(i)), "prob": round(float(p), DIGITS)}
            for i, p in zip(ids, probs, strict=True)
        ]
        return {**top[0], "top": top}

    return {
        "model": look.model,
        "architecture": geometry.architecture,
        "layers": geometry.n_layer,
        "heads": geometry.n_head,
        "kv_heads": geometry.n_head_kv,
        "embedding_size": geometry.n_embd,
        "vocabulary": geometry.n_vocab,
        "positions": {
            "rope": geometry.rope,
            "base": geometry.rope_base,
            "sliding_window": geometry.sliding_window,
            "text": positions_line(geometry),
        },
        "tokens": [{"position": t.position, "id": t.id, "text": t.text, "norm": round(t.norm, 4)} for t in look.tokens],
        "attention_layers": sorted(look.attention),
        "attention": [
            (
                [
                    [[round(float(w), DIGITS) for w in weights[head, query, : query + 1]] for query in range(n)]
                    for head in range(weights.shape[0])
                ]
                if (weights := look.attention.get(layer)) is not None
                else None
            )
            for layer in range(geometry.n_layer)
        ],
        "lens": [[cell(layer, position) for position in range(n)] for layer in range(geometry.n_layer)],
        "lens_complete": look.lens_shown,
        "neighbours": {
            text(token_id): [{"id": x.id, "text": x.text, "cosine": round(x.cosine, 4)} for x in near]
            for token_id, near in look.neighbours.items()
        },
        "seconds": {name: round(value, 3) for name, value in look.seconds.items()},
        "notes": look.notes,
    }
