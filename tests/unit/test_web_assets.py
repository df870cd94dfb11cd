"""The page's files: each one the server names exists, each file of the page is named, and every
script, style or module the page loads is one of them (a missing one would be a 404 in the browser)."""

from __future__ import annotations

import re
from importlib.resources import files

from llmrun.server import web

WEB = files("llmrun.server").joinpath("web")


def _on_disk() -> set[str]:
    found: set[str] = set()
    for entry in WEB.iterdir():
        if entry.is_dir():
            found |= {f"{entry.name}/{inner.name}" for inner in entry.iterdir()}
        else:
            found.add(entry.name)
    return {name for name in found if not name.split("/")[-1].startswith("LICENSE")}


def test_the_served_files_are_the_pages_files() -> None:
    assert _on_disk() == set(web.ASSETS)
    assert all(web.asset(name) for name in (*web.ASSETS, *web.LOOK_ASSETS))


def test_every_reference_of_the_page_is_served() -> None:
    references: set[str] = set()
    for name in web.ASSETS:
        if name.endswith((".html", ".js")):
            text = web.asset(name).decode()
            references |= set(re.findall(r"""["'(]/ui/([\w./-]+)["')]""", text))
    assert references
    assert references <= set(web.ASSETS) | set(web.LOOK_ASSETS), references - set(web.ASSETS)


def test_the_page_is_small() -> None:
    assert web.total_size() < 200_000  # docs/web.md states the figure
