"""The page at ``/``: a chat that shows its own probabilities, and the forward-pass views.

Every asset is a file of the package (``llmrun/server/web/``), served from a fixed list: a client's
path never becomes a file name. The page and its assets are answered without a key (they hold no
data; the page asks for the key and keeps it for the browser session); their Content-Security-Policy
lets them load scripts, styles and data from this server only.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response

from llmrun.api.errors import ApiError

# name → media type; look.js and look.css are the look package's own (``llmrun look --html`` inlines them)
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "images.js": "text/javascript; charset=utf-8",
    "probs.js": "text/javascript; charset=utf-8",
    "store.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
    "vendor/marked.esm.js": "text/javascript; charset=utf-8",
    "vendor/purify.min.js": "text/javascript; charset=utf-8",
}
LOOK_ASSETS = {"look.js": "text/javascript; charset=utf-8", "look.css": "text/css; charset=utf-8"}
PAGE_PATHS = ("/", "/favicon.ico")
ASSET_PREFIX = "/ui/"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_page_path(path: str) -> bool:
    """A path the page is served at (answered without a key)."""
    return path in PAGE_PATHS or path.startswith(ASSET_PREFIX)


@cache
def asset(name: str) -> bytes:
    if name in LOOK_ASSETS:
        return files("llmrun.look").joinpath(name).read_bytes()
    return files("llmrun.server").joinpath("web", name).read_bytes()


def total_size() -> int:
    """The page's bytes, every asset included."""
    return sum(len(asset(name)) for name in (*ASSETS, *LOOK_ASSETS))


def add_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return _answer("index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return _answer("icon.svg")

    @app.get(ASSET_PREFIX + "{name:path}", include_in_schema=False)
    async def ui_asset(name: str) -> Response:
        if name not in ASSETS and name not in LOOK_ASSETS:
            raise ApiError(404, f"no such file of the page: {name[:80]}", code="not_found")
        return _answer(name)


def _answer(name: str) -> Response:
    media = ASSETS.get(name) or LOOK_ASSETS[name]
    return Response(asset(name), media_type=media, headers=HEADERS)
