"""The CLI without a model: help, version, start-up imports, and the error table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmrun.paths import user_registry_path
from tests.support import ggufbuild as gb
from tests.support.helpers import invoke, llmrun


def test_help_and_version() -> None:
    code, out, _ = invoke(["--help"])
    assert code == 0 and "run" in out
    code, out, _ = invoke(["run", "--help"])
    assert code == 0
    for flag in (
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--repeat-last-n",
        "--presence-penalty",
        "--frequency-penalty",
        "--seed",
        "--max-tokens",
        "--stop",
        "--ctx",
        "--threads",
        "--gpu-layers",
        "--system",
        "--raw",
        "--stats",
        "--json",
        "--show-params",
        "--force",
        "--backend",
        "--kv-bits",
        "--max-kv-size",
    ):
        assert flag in out, flag
    assert "Default: 0.8." in out and "Default: 512." in out  # defaults survive Rich markup
    code, out, _ = invoke(["--version"])
    assert code == 0 and out.startswith("llmrun ")


def test_python_dash_m_and_help_keep_heavy_modules_out() -> None:
    probe = (
        "import sys\n"
        "from llmrun.cli.app import main\n"
        "sys.argv = ['llmrun', 'run', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('llama_cpp', 'numpy', 'huggingface_hub', 'mlx', 'mlx_lm', 'gguf') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "HEAVY []" in result.stderr
    assert llmrun(["--help"]).returncode == 0


def test_a_command_imports_its_own_module_and_not_the_others() -> None:
    probe = (
        "import sys\n"
        "from llmrun.cli.app import main\n"
        "sys.argv = ['llmrun', '--debug', 'run', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('llmrun.cli.')), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "'llmrun.cli.run'" in result.stderr and "--max-tokens" in result.stdout
    for other in ("serve", "quantize", "batch", "index", "convert", "bench"):
        assert f"'llmrun.cli.{other}'" not in result.stderr


def test_the_root_help_lists_every_command_without_importing_them() -> None:
    from llmrun.cli.app import COMMANDS, GROUPS

    probe = (
        "import sys\n"
        "from llmrun.cli.app import main\n"
        "sys.argv = ['llmrun', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('llmrun.cli.')), file=sys.stderr)\n"
    )
    env = {**os.environ, "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    assert "LOADED ['llmrun.cli.app', 'llmrun.api.flags']" in result.stderr or "LOADED ['llmrun.cli.app']" in (
        result.stderr
    )
    for name, (*_, summary) in {**COMMANDS, **GROUPS}.items():
        assert re.search(rf"\b{name}\s+{re.escape(summary)}", result.stdout), name


def test_each_command_is_listed_with_the_summary_it_shows_when_loaded() -> None:
    import typer
    import typer.main

    from llmrun.cli.app import COMMANDS, GROUPS, build

    group: Any = typer.main.get_command(build())
    context = typer.Context(group)
    shown = {
        name: group.get_command(context, name).get_short_help_str(limit=500) for name in group.list_commands(context)
    }
    assert shown == {name: summary for name, (*_, summary) in {**COMMANDS, **GROUPS}.items()}


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["run", "hi"], "run"),
        (["--debug", "index", "add"], "index"),
        (["--offline", "--debug", "chat"], "chat"),
        (["--help"], None),
        (["--version", "run"], None),
        (["nonsense"], None),
        ([], None),
    ],
)
def test_the_command_is_found_past_the_roots_options(argv: list[str], command: str | None) -> None:
    from llmrun.cli.app import command_named

    assert command_named(argv) == command


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--top-k", "-5"], "--top-k must be >= 0"),
        (["--min-p", "2"], "--min-p must be in [0, 1]"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be > 0"),
        (["--repeat-last-n", "-7"], "--repeat-last-n must be >= -1"),
        (["--presence-penalty", "9"], "--presence-penalty must be in [-2, 2]"),
        (["--frequency-penalty", "-9"], "--frequency-penalty must be in [-2, 2]"),
        (["--seed", "-3"], "--seed must be in [0,"),
        (["-n", "0"], "--max-tokens must be >= 1, or -1"),
        (["--temperature", "nan"], "--temperature must be a finite number"),
        (["--backend", "cuda"], "--backend must be one of auto, gguf, mlx"),
        (["--kv-bits", "3"], "--kv-bits must be 4, 8 or 16"),
        (["--max-kv-size", "2"], "--max-kv-size must be an integer >= 16"),
    ],
)
def test_bad_flag_values_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out, err = invoke(["run", *args, "hello"])
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--top-k", "abc"], "Invalid value for '--top-k'"), (["--bogus"], "No such option"), (["--seed"], "requires")],
)
def test_unparsable_flags_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out, err = invoke(["run", *args])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "--help" in lines[0], err


def test_unknown_command_gets_one_line() -> None:
    code, _, err = invoke(["rnu"])
    assert code == 2 and "No such command" in err and len(err.strip().splitlines()) == 1


def test_logprobs_without_json_is_refused() -> None:
    code, _, err = invoke(["run", "--logprobs", "3", "hi"])
    assert code == 2 and "--logprobs goes with --json" in err


def test_missing_prompt_is_a_usage_error() -> None:
    code, _, err = invoke(["run"], stdin="")
    assert code == 2 and "no prompt given" in err


def test_unknown_model_suggests_known_ones() -> None:
    code, _, err = invoke(["run", "-m", "gemma3:27", "hi"])
    assert code == 1
    assert "unknown model 'gemma3:27'" in err and "gemma3:270m" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        (b"just some text, not a model\n" * 4, "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00" + b"\xff" * 40, "metadata entries, more than the file can hold"),
    ],
)
def test_bad_model_files_get_one_line(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    code, out, err = invoke(["run", "-m", str(path), "hi"])
    assert code == 1 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_malformed_user_models_toml_names_file_and_line() -> None:
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    path.write_text('[models."mine:1b"]\ndescription = "x"\ntemperatur = 1\n')
    code, _, err = invoke(["run", "hi"])
    assert code == 1
    assert f"{path}:3" in err and "did you mean" in err


def test_out_of_memory_refusal_from_a_crafted_header(tmp_path: Path) -> None:
    path = gb.write_huge(tmp_path / "huge.gguf")
    code, _, err = invoke(["run", "-m", str(path), "hi"])
    assert code == 1
    assert "needs about 256.1 GiB" in err and "available" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1


def test_batch_context_defaults_to_at_most_the_trained_length(tmp_path: Path) -> None:
    """Without --ctx, batch plans 2048 tokens a sequence, or the trained length when shorter
    (here 1024: the memory refusal shows the plan)."""
    path = gb.write_huge(tmp_path / "short.gguf", **{"llama.context_length": 1024})
    prompts = tmp_path / "in.txt"
    prompts.write_text("hi\n")
    code, _, err = invoke(["batch", str(prompts), "-m", str(path)])
    assert code == 1 and "at 1024 tokens" in err and "beyond" not in err, err
    code, _, err = invoke(["batch", str(prompts), "-m", str(path), "--ctx", "4096"])
    assert code == 1 and "at 4096 tokens" in err, err  # --ctx as given


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"llama.block_count": 4096}, "sane layer count"), ({"general.architecture": 7}, "general.architecture")],
)
def test_headers_that_would_abort_llama_cpp_are_refused(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    path = gb.write_huge(tmp_path / "bad.gguf", **overrides)
    code, _, err = invoke(["run", "--force", "-m", str(path), "hi"])
    assert code == 1 and "is not a runnable model" in err and message in err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = llmrun(["--debug", "run", "-m", str(tmp_path / "none.gguf"), "hi"])
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ModelFileError" in result.stderr
    plain = llmrun(["run", "-m", str(tmp_path / "none.gguf"), "hi"])
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("error: model file")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["tokenize"], 2, "no text given"),
        (["next"], 2, "no text given"),
        (["next", "hi", "--top", "0"], 2, "--top"),
        (["next", "hi", "--top-p", "2"], 2, "--top-p must be in (0, 1]"),
        (["show", "--ctx", "4"], 2, "--ctx must be an integer >= 16"),
        (["bench", "-p", "0"], 2, "--n-prompt"),
        (["bench", "--backend", "onnx"], 2, "choose from auto, gguf, mlx"),
        (["show", "no-such-model"], 1, "unknown model"),
    ],
)
def test_inspection_commands_reject_bad_input_in_one_line(args: list[str], code: int, message: str) -> None:
    exit_code, out, err = invoke(args, stdin="")
    assert exit_code == code and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_batch_input_problems_are_one_line(tmp_path: Path) -> None:
    code, _, err = invoke(["batch", str(tmp_path / "missing.txt")])
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    code, _, err = invoke(["batch", str(empty)])
    assert code == 2 and "has no prompts" in err
    code, _, err = invoke(["batch", "-"], stdin='{"prompt": 1}\n')
    assert code == 2 and "has no prompts" in err and "needs either" in err
    code, _, err = invoke(["batch", str(tmp_path)])
    assert code == 2 and "is a directory" in err


def test_a_bad_default_model_says_where_it_was_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMRUN_MODEL", "nope")
    code, _, err = invoke(["run", "hi"])
    assert code == 1 and "unknown model 'nope' (the default model, set by LLMRUN_MODEL)" in err


@pytest.mark.parametrize(
    "content",
    ["[1, 2]", '{"version": 1, "models": {"x": 5}}', '{"version": 1, "models": {"x": {"files": [{}]}}}', "{not json"],
)
def test_a_damaged_model_index_is_one_line_and_other_models_keep_working(gemma: Path, content: str) -> None:
    index = Path(os.environ["LLMRUN_HOME"]) / "index.json"
    index.write_text(content)
    code, out, err = invoke(["list", "--json"])
    assert code == 0 and f"the model index {index}" in err and "delete it" in err
    assert "(embedded package)" in [row["repo"] for row in json.loads(out)]  # still listed
    code, out, err = invoke(["show", "gemma3:270m", "--json"])  # resolves through models.toml
    assert code == 0 and json.loads(out)["architecture"] == "gemma3", err
    for args in (["rm", "-y", "mine"], ["show", "my-own-quant"]):  # names only the index could hold
        code, _, err = invoke(args)
        assert code == 1 and f"the model index {index}" in err and len(err.strip().splitlines()) == 1, err
        assert "internal error" not in err


def test_list_piped_is_one_line_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(os.environ["LLMRUN_HOME"])
    long_path = home / "models" / ("deeply/nested/" * 4) / "gemma-3-270m-q4_k_m-with-a-long-file-name.gguf"
    long_path.parent.mkdir(parents=True)
    long_path.write_bytes(b"GGUF")
    files = [{"name": long_path.name, "path": str(long_path), "size": 4, "sha256": "0" * 64}]
    names = ["hf.co/some-organisation/a-very-long-repository-name-GGUF:Q4_K_M", "x"]
    entry = {"repo": "o/r", "files": files, "pulled": "2026-12-01T10:00:00+0000", "format": "gguf"}
    (home / "index.json").write_text(json.dumps({"version": 1, "models": dict.fromkeys(names, entry)}))
    monkeypatch.delenv("COLUMNS", raising=False)
    lines = llmrun(["list"]).stdout.splitlines()  # a pipe, not a terminal
    rows = {line.split()[0]: line.rstrip() for line in lines[1:]}
    models = len(json.loads(llmrun(["list", "--json"]).stdout))
    assert len(lines) == 1 + models and set(names) <= set(rows) and rows[names[0]].endswith(str(long_path))
    narrow = llmrun(["list"], env={"COLUMNS": "60"}).stdout.splitlines()
    assert len(narrow) > len(lines) and max(len(line.rstrip()) for line in narrow) <= 60  # COLUMNS is honoured


def test_doctor_reports_versions_paths_and_problems_with_fixes() -> None:
    from importlib.metadata import version

    import llama_cpp

    code, out, err = invoke(["doctor", "--json"])
    report = json.loads(out)
    assert code == (1 if any(p["severity"] == "error" for p in report["problems"]) else 0), err  # warnings: 0
    # what it reports is what the libraries themselves say
    assert report["versions"]["llama-cpp-python"] == version("llama-cpp-python") == llama_cpp.__version__
    # a GPU device, not llama_supports_gpu_offload: that one also says yes for a build with the RPC backend alone
    gpu_backends = ("CUDA", "Metal", "METAL", "Vulkan", "VULKAN", "HIP", "SYCL", "OpenCL")
    has_gpu_backend = any(name in report["llama_cpp"]["system_info"] for name in gpu_backends)
    if not has_gpu_backend:
        assert report["llama_cpp"]["gpu_offload"] is False
    assert report["llama_cpp"]["rpc"] is bool(llama_cpp.llama_supports_rpc())
    assert report["llama_cpp"]["system_info"] == llama_cpp.llama_print_system_info().decode().strip()
    assert report["paths"]["data (LLMRUN_HOME)"] == os.environ["LLMRUN_HOME"]
    assert 0 < report["memory"]["available"] <= report["memory"]["total"]
    # a problem it must find: a broken models.toml, named with the file to edit, and exit code 1
    path = user_registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[models.broken\n")
    code, out, err = invoke(["doctor", "--json"])
    problems = json.loads(out)["problems"]
    assert code == 1 and any(p["what"].startswith("models.toml:") and str(path) in p["fix"] for p in problems)
    assert all(p["fix"] and "`" not in p["fix"] for p in problems)
    code, out, err = invoke(["doctor"])
    assert code == 1 and "llama-cpp-python" in out and "models.toml" in err and "Traceback" not in err
