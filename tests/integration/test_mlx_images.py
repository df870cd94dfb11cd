"""Images on MLX through mlx-vlm: a small Gemma 3 vision model in mlx-vlm's layout (the packaged Gemma 3 270M
converted to MLX, with a random one-layer vision tower: ``tests/support/mlx_vision_model.py``). Its answers mean
nothing; every part of the path runs, and mlx-vlm's own model, decoding the same tokens and pixels, gives the
same greedy tokens. (On Apple silicon the same code runs on the GPU; here mlx[cpu] runs it.)"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from llmrun.backends.base import LoadParams
from llmrun.decoding.events import Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request, request_ids, templates_for
from llmrun.errors import ContextFull, UsageError
from llmrun.formats.mlx_header import read_mlx_header
from llmrun.prompt.template import BUILTIN_TEMPLATES
from tests.support import imagefiles, mlx_vision_model
from tests.support.helpers import invoke

# (found, not imported: mlx must be first imported by llmrun, after it loads OpenBLAS — see formats/mlx_runtime.py)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_spec("mlx_vlm") is None, reason="mlx-vlm (the mlx-vision extra) reads images on MLX"),
]
GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPT = "Describe the picture."


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("mlx-images")
    return imagefiles.png(folder / "a.png", 64, 48, seed=1), imagefiles.png(folder / "b.png", 90, 120, seed=2)


@pytest.fixture(scope="module")
def model(gemma_mlx_vision: Path) -> Iterator[object]:
    from llmrun.backends.mlx import MlxBackend

    loaded = MlxBackend().load(gemma_mlx_vision, LoadParams(512, 2, 0))
    loaded.use_projector(gemma_mlx_vision)
    yield loaded
    loaded.close()


@functools.cache
def templates(folder: Path) -> Any:
    return templates_for(None, read_mlx_header(folder), chosen=(BUILTIN_TEMPLATES["gemma"], "gemma"))


def prepared(model: object, folder: Path, *images: bytes) -> tuple[list[int], tuple[int, ...]]:
    prompt = request_ids(model, templates(folder), Request(prompt=PROMPT, images=images)).prompt  # type: ignore[arg-type]
    return prompt.ids, prompt.images


def answer(model: object, folder: Path, *images: bytes) -> tuple[list[int], Done]:
    ids, at = prepared(model, folder, *images)
    events = list(model.stream_images(ids, at, images, GREEDY))  # type: ignore[attr-defined]
    done = events[-1]
    assert isinstance(done, Done)
    return [e.id for e in events if isinstance(e, Token)], done


def test_two_images_differ_and_one_seen_again_is_reused(
    model: object, gemma_mlx_vision: Path, images: tuple[Path, Path]
) -> None:
    a, b = images[0].read_bytes(), images[1].read_bytes()
    first, _ = answer(model, gemma_mlx_vision, a)
    other, _ = answer(model, gemma_mlx_vision, b)
    assert first != other
    again, repeated = answer(model, gemma_mlx_vision, a)
    assert again == first and repeated.stats.images_reused == 1 and repeated.stats.image_seconds == 0
    _, at = prepared(model, gemma_mlx_vision, a)
    assert repeated.stats.cached_tokens == at[0]  # the other image's prompt shares the text before the image
    _, same = answer(model, gemma_mlx_vision, a)
    assert same.stats.cached_tokens == same.stats.prompt_tokens - 1  # the image's positions came from the cache


def test_over_the_context_and_the_wrong_projector_are_refused(
    model: object, gemma_mlx_vision: Path, gemma_mlx16: Path, images: tuple[Path, Path]
) -> None:
    many = (images[0].read_bytes(),) * 30  # 30 × 20 positions: over the context of 512, refused before evaluating
    ids, at = prepared(model, gemma_mlx_vision, *many)
    with pytest.raises(ContextFull, match="positions"):
        list(model.stream_images(ids, at, many, GREEDY))  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="its own vision tower"):
        model.use_projector(gemma_mlx16)  # type: ignore[attr-defined]
    assert model.sees_images  # type: ignore[attr-defined]


def test_run_and_show_find_the_vision_tower_in_the_directory(
    gemma: Path, gemma_mlx_vision: Path, gemma_mlx16: Path, images: tuple[Path, Path]
) -> None:
    args = ["run", "-m", str(gemma_mlx_vision), "--backend", "mlx", "--template", "gemma", "-t", "0", "-n", "4"]
    code, out, err = invoke([*args, "--image", str(images[0]), "--json", "--show-params", PROMPT])
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"]["images"] == mlx_vision_model.IMAGE_TOKENS + 4 and "own vision tower" in err
    code, out, _ = invoke(["show", str(gemma_mlx_vision), "--backend", "mlx", "--json"])
    assert code == 0 and json.loads(out)["mmproj"] == str(gemma_mlx_vision)
    code, _, err = invoke(["run", "-m", str(gemma_mlx16), "--backend", "mlx", "--image", str(images[0]), PROMPT])
    assert code == 2 and "does not see images" in err and "vision_config" in err


def test_greedy_tokens_and_distributions_equal_mlx_vlms_own_model(
    model: object, gemma_mlx_vision: Path, images: tuple[Path, Path]
) -> None:
    import mlx.core as mx
    from mlx_vlm.generate import generate_step
    from mlx_vlm.utils import load_model
    from PIL import Image

    from llmrun.backends.mlx_vision import image_prompt

    data = images[1].read_bytes()
    ids, at = prepared(model, gemma_mlx_vision, data)
    events = list(model.stream_images(ids, at, (data,), GREEDY, logprobs=20))  # type: ignore[attr-defined]
    done = events[-1]
    assert (
        isinstance(done, Done) and done.stats.image_tokens == mlx_vision_model.IMAGE_TOKENS + 4
    )  # \n\n boi … eoi \n\n
    tokens = [e for e in events if isinstance(e, Token)]
    vision = model._vision_half()  # type: ignore[attr-defined]
    full = image_prompt(vision, ids, at, [data]).ids
    reference = load_model(gemma_mlx_vision)  # its own text model, its own decoding loop (the same processor)
    processor = vision.processor
    computed = model.model.language_model.model.embed_tokens.weight.dtype  # type: ignore[attr-defined]
    reference.language_model.set_dtype(computed)  # as llmrun computes (float32 on a CPU); the vision towers as stored
    pixels = processor(text=[processor.boi_token], images=[Image.open(images[1]).convert("RGB")])["pixel_values"]

    steps = list(
        generate_step(mx.array([full]), reference, pixels, mx.ones((1, len(full))), max_tokens=8, temperature=0.0)
    )
    assert [t.id for t in tokens] == [int(token) for token, _ in steps]
    # the bound: what two float32 paths differ by here (2e-3); in bfloat16 (no OpenBLAS), more: twice what
    # mlx-vlm's own bfloat16 answer is measured to differ from its float32 answer on this CPU, as each of
    # the two bfloat16 paths rounds its own way around the float32 one
    bound = 2e-3
    if computed != mx.float32:
        reference.language_model.set_dtype(mx.float32)
        exact = list(
            generate_step(mx.array([full]), reference, pixels, mx.ones((1, len(full))), max_tokens=8, temperature=0.0)
        )
        rounding = max(
            float(mx.max(mx.abs(a[mx.argsort(-a)[:20]].astype(mx.float32) - b[mx.argsort(-a)[:20]])).item())
            for (_, a), (_, b) in zip(steps, exact, strict=False)
        )
        bound += 2 * rounding
        ours = max(
            abs(c.logprob - float(e[c.id].item())) for t, (_, e) in zip(tokens, exact, strict=False) for c in t.top
        )
        print(f"against float32 here, in {computed}: mlx-vlm {rounding:.4f}, llmrun {ours:.4f}; bound {bound:.4f}")
        assert ours <= 1.5 * rounding + 2e-3  # llmrun's bfloat16 path is as close to float32 as mlx-vlm's own
    for token, (_, logprobs) in zip(tokens, steps, strict=True):  # each step's whole top 20, as mlx-vlm computes it
        expected = sorted(enumerate(logprobs.tolist()), key=lambda pair: -pair[1])[:20]
        assert [c.id for c in token.top][:5] == [i for i, _ in expected][:5]
        assert [c.logprob for c in token.top] == pytest.approx([p for _, p in expected], abs=bound)
