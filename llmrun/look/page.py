"""``llmrun look --html``: one self-contained page — no network, no CDN, no fonts from the internet.

The page (``page.html``, with ``look.css`` and ``look.js`` inlined: the views the page at ``/`` of
``llmrun serve`` shows too) carries the ``--json`` report in a
``<script type="application/json">`` block; its Content-Security-Policy allows nothing to
load from anywhere, so it opens the same offline, from a file or from an e-mail.
"""

from __future__ import annotations

import html
import json
from functools import cache
from importlib.resources import files
from typing import Any


@cache
def _template() -> str:
    here = files("llmrun.look")
    return (
        here.joinpath("page.html")
        .read_text(encoding="utf-8")
        .replace("__CSS__", here.joinpath("look.css").read_text(encoding="utf-8"))
        .replace("__SCRIPT__", here.joinpath("look.js").read_text(encoding="utf-8").replace("</", "<\\/"))
    )


def embedded_json(value: Any) -> str:
    """JSON that cannot end the script element it sits in (no ``<`` survives: ``</script>``, ``<!--``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def page(report: dict[str, Any]) -> str:
    return (
        _template()
        .replace("__TITLE__", html.escape(str(report.get("model", ""))))
        .replace("__DATA__", embedded_json(report))
    )
