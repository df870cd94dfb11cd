"""Each failure of a remote engine is one line, and the key never shows: driven through the real client
against a real HTTP server on 127.0.0.1 that fails on purpose (tests/remote/scripted.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import scripted
from tests.support.helpers import invoke
from tests.support.serving import free_port

SECRET = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, scripted.Script]]:
    with scripted.serving() as running:
        yield running


def run(url: str, *extra: str) -> tuple[int, str, str]:
    return invoke(["run", "--endpoint", url, "Hi", "-t", "0", *extra])


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_an_answer_streams_with_the_endpoints_counts(server: tuple[str, scripted.Script]) -> None:
    root, _ = server
    code, out, err = run(f"{root}/ok/v1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["text"] == "Hello there" and report["model"] == "scripted" and report["backend"] == "remote"
    assert (report["tokens"]["prompt"], report["tokens"]["generated"]) == (7, 3)


def test_the_key_goes_in_the_header_and_never_in_output(
    server: tuple[str, scripted.Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, script = server
    monkeypatch.setenv("LLMRUN_API_KEY", SECRET)
    code, out, err = run(f"{root}/ok/v1", "--json", "--stats", "--show-params")
    assert code == 0
    assert f"Bearer {SECRET}" in script.auth
    assert SECRET not in out + err


@pytest.mark.parametrize("prefix", ["auth", "forbidden"])
def test_a_refused_key_names_its_variable_not_the_key(
    server: tuple[str, scripted.Script], monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    root, _ = server
    monkeypatch.setenv("LLMRUN_API_KEY", SECRET)
    code, out, err = run(f"{root}/{prefix}/v1")
    line = one_line(err)
    assert code == 1 and not out
    assert "LLMRUN_API_KEY" in line and "HTTP 40" in line and SECRET not in line
    monkeypatch.delenv("LLMRUN_API_KEY")
    assert "needs a key: set LLMRUN_API_KEY" in one_line(run(f"{root}/{prefix}/v1")[2])


def test_429_is_retried_honouring_retry_after(server: tuple[str, scripted.Script]) -> None:
    root, script = server
    code, out, err = run(f"{root}/busy/v1")
    assert code == 0, err
    assert out.strip() == "Hello there" and script.hits["busy"] == 3


def test_503_is_retried_a_bounded_number_of_times_then_one_line(server: tuple[str, scripted.Script]) -> None:
    root, script = server
    before = script.hits["down"]
    code, _, err = run(f"{root}/down/v1")
    assert code == 1
    assert "HTTP 503 (overloaded) 4 times" in one_line(err)
    assert script.hits["down"] - before == 4


def test_a_stream_cut_mid_answer_keeps_what_arrived(server: tuple[str, scripted.Script]) -> None:
    root, _ = server
    code, out, err = run(f"{root}/cut/v1")
    assert code == 1
    assert out.startswith("Hello")  # the tokens that came were shown
    assert "cut off after 2 chunks" in one_line(err)


def test_a_setting_the_endpoint_rejects(server: tuple[str, scripted.Script]) -> None:
    root, script = server
    code, out, _ = run(f"{root}/picky/v1")
    assert code == 0 and out.strip() == "Hello there"  # asked again without the settings nobody set
    assert "top_k" not in script.bodies[-1] and "top_k" in script.bodies[-2]
    code, _, err = run(f"{root}/picky/v1", "--top-k", "5")
    assert code == 1
    assert "rejected --top-k: Unrecognized request argument supplied: top_k" in one_line(err)


def test_a_model_the_endpoint_does_not_serve_lists_what_it_does(server: tuple[str, scripted.Script]) -> None:
    root, _ = server
    code, _, err = run(f"{root}/missing/v1", "-m", "gpt-5")
    assert code == 1
    assert "does not serve 'gpt-5'; it serves: a, b" in one_line(err)
    code, _, err = run(f"{root}/missing/v1")
    assert "serves 2 models (a, b); which one?" in one_line(err)


def test_unreachable_host_and_tls_errors_are_one_line(server: tuple[str, scripted.Script]) -> None:
    root, _ = server
    code, _, err = run(f"http://127.0.0.1:{free_port()}/v1")
    assert code == 1 and "connection refused" in one_line(err)
    code, _, err = run(root.replace("http://", "https://") + "/ok/v1")
    assert code == 1 and "TLS failed" in one_line(err)


def test_commands_that_need_the_model_itself_say_a_remote_engine_cannot(
    server: tuple[str, scripted.Script], hermetic_env: Path, tmp_path: Path
) -> None:
    root, _ = server
    config = tmp_path / "llmrun-config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "models.toml").write_text(f'[models.far]\nendpoint = "{root}/ok/v1"\nmodel = "scripted"\n')
    for command in (["next", "-m", "far", "Hi"], ["tokenize", "-m", "far", "Hi"], ["show", "far", "--template"]):
        code, _, err = invoke(command)
        assert code == 2, command
        assert "remote engine" in one_line(err)
    code, out, _ = invoke(["run", "-m", "far", "Hi", "-t", "0"])
    assert code == 0 and out.strip() == "Hello there"
    code, out, _ = invoke(["list", "--json"])
    assert {"name": "far", "format": "remote", "path": f"{root}/ok/v1"}.items() <= json.loads(out)[-1].items()
    code, out, _ = invoke(["show", "far", "--json"])
    card = json.loads(out)["endpoints"][0]
    assert (card["model"], card["served"], card["slots"]) == ("scripted", ["scripted"], 2)
    code, _, err = invoke(["run", "-m", "far", "Hi", "--threads", "2"])
    assert code == 2 and "set by the engine that serves the model" in one_line(err)


def test_batch_moves_prompts_off_a_failing_endpoint(server: tuple[str, scripted.Script], tmp_path: Path) -> None:
    root, _ = server
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(6)))
    out = tmp_path / "out.jsonl"
    args = ["batch", str(prompts), "-o", str(out), "--endpoint", f"{root}/down/v1", "--endpoint", f"{root}/ok/v1"]
    code, _, err = invoke(args)
    assert code == 0, err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert all(line["text"] == "Hello there" for line in lines)


def test_batch_with_every_endpoint_failing_answers_nothing_and_says_so(
    server: tuple[str, scripted.Script], tmp_path: Path
) -> None:
    root, _ = server
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\n")
    out = tmp_path / "out.jsonl"
    _, _, err = invoke(["batch", str(prompts), "-o", str(out), "--endpoint", f"{root}/down/v1"])
    assert "0 of 2 prompts answered" in err and err.count("HTTP 503") == 2
    assert out.read_text() == ""
