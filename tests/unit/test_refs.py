"""Model-name parsing: aliases, hub names, paths, and names that try to be paths."""

from __future__ import annotations

import pytest

from llmrun.errors import LlmrunError
from llmrun.models.refs import ModelRef


@pytest.mark.parametrize(
    ("text", "kind", "name", "tag", "file"),
    [
        ("gemma3:270m", "alias", "gemma3:270m", "270m", None),
        ("Qwen2.5:0.5B-Q8", "alias", "qwen2.5:0.5b-q8", "0.5b-q8", None),
        ("llama3.2", "alias", "llama3.2", None, None),
        ("Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m", "hub", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Q4_K_M", None),
        ("hf.co/owner/repo:q8_0", "hub", "owner/repo", "Q8_0", None),
        ("owner/repo/model-q4.gguf", "hub", "owner/repo", None, "model-q4.gguf"),
        ("./models/m.gguf", "path", "./models/m.gguf", None, None),
        ("/abs/m.gguf", "path", "/abs/m.gguf", None, None),
        ("~/m.gguf", "path", "~/m.gguf", None, None),
        ("m.gguf", "path", "m.gguf", None, None),
        ("a/b/../m.gguf", "path", "a/b/../m.gguf", None, None),
    ],
)
def test_parse(text: str, kind: str, name: str, tag: str | None, file: str | None) -> None:
    ref = ModelRef.parse(text)
    assert (ref.kind, ref.name, ref.tag, ref.file) == (kind, name, tag, file)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        "a\x00b",
        "owner/../etc",
        "owner/..:q4",
        "a/b/c/d",
        "owner/repo/file.txt",
        "owner/repo:../x",
        "bad name with spaces",
    ],
)
def test_hostile_or_malformed_names_are_refused(text: str) -> None:
    with pytest.raises(LlmrunError):
        ModelRef.parse(text)


def test_quant_tags_and_choice() -> None:
    from llmrun.errors import ModelNotFound
    from llmrun.models.quants import choose, quant_of

    assert quant_of("qwen2.5-0.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert quant_of("Phi-3-mini-4k-instruct-q4.gguf") == "Q4"
    assert quant_of("x.Q5_K_M-00001-of-00002.gguf") == "Q5_K_M"
    files = ["m-Q8_0.gguf", "m-Q4_K_S.gguf", "m-mmproj-f16.gguf", "README.md"]
    assert choose(files, None) == (["m-Q4_K_S.gguf"], "Q4_K_S, the closest 4-bit quant to Q4_K_M")
    assert choose(files, "q8_0")[0] == ["m-Q8_0.gguf"]
    assert choose(["m-Q6_K.gguf", "m-Q2_K.gguf"], None)[0] == ["m-Q2_K.gguf"]  # no 4-bit: the first
    with pytest.raises(ModelNotFound, match="no Q5_K_M"):
        choose(files, "Q5_K_M")
    with pytest.raises(ModelNotFound, match=r"no \.gguf files"):
        choose(["README.md"], None)


def test_the_projector_fetched_with_a_model() -> None:
    from llmrun.models.quants import choose_projector, gguf_groups

    names = ["m-Q4_K_M.gguf", "mmproj-BF16.gguf", "mmproj-F32.gguf", "mmproj-F16.gguf", "README.md"]
    assert choose_projector(names) == ("mmproj-F16.gguf", "projector mmproj-F16.gguf")
    assert choose_projector(["mmproj-F32.gguf", "mmproj-Q8_0.gguf"])[0] == "mmproj-Q8_0.gguf"
    assert choose_projector(["gemma-3-4b-it-mmproj-model-f16.gguf"])[0] == "gemma-3-4b-it-mmproj-model-f16.gguf"
    assert choose_projector(["mmproj.gguf", "mmproj-x.gguf"])[0] == "mmproj-x.gguf"  # none named: the first
    assert choose_projector(["m-Q4_K_M.gguf", "vision/mmproj-F16.gguf", "mmproj.txt"]) == (
        None, "no projector in the repo",
    )  # fmt: skip
    assert list(gguf_groups(names)) == ["m-Q4_K_M.gguf"]  # a projector is never the model
