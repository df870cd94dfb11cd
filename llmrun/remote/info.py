"""What an endpoint says about the models it serves (``llmrun show`` on a remote model)."""

from __future__ import annotations

from typing import Any

from llmrun.errors import RemoteError
from llmrun.models.endpoint import Endpoint
from llmrun.remote.client import Client
from llmrun.remote.fleet import reported_slots

CONTEXT_KEYS = ("max_model_len", "context_length", "n_ctx", "n_ctx_train")  # vLLM, LM Studio, llama-server


def describe(endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint's model card for the model (``/v1/models``), its context and slots where it reports them."""
    client = Client(endpoint, retries=1)
    try:
        data = client.get("/models")
        rows = [r for r in (data.get("data") or []) if isinstance(r, dict)] if isinstance(data, dict) else []
        served = [str(r.get("id")) for r in rows]
        wanted = endpoint.model or (served[0] if len(served) == 1 else None)
        if wanted is not None and wanted not in served:
            raise RemoteError(
                f"{endpoint.host} does not serve {wanted!r}; it serves: {', '.join(served) or 'nothing'}",
                "fix 'model' in models.toml",
            )
        card = next((r for r in rows if r.get("id") == wanted), {})
        return {
            "endpoint": endpoint.url,
            "model": wanted,
            "served": served,
            "owned_by": card.get("owned_by"),
            "context_length": _context(card),
            "slots": reported_slots(client),
            "key": endpoint.key_env if endpoint.key else None,
        }
    finally:
        client.close()


def _context(card: dict[str, Any]) -> int | None:
    meta: dict[str, Any] = card["meta"] if isinstance(card.get("meta"), dict) else {}
    for source in (card, meta):
        for key in CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
