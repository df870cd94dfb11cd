"""`llmrun quantize`, `llmrun eval` and `llmrun convert --to gguf` on the real Gemma 3 270M.

The packaged Q4_K_M GGUF is dequantized to F16 (the `gemma_f16` fixture, once per machine),
then quantized by llama.cpp's own quantizer to Q8_0 and Q4_K_M; the quality report must
order them as their bits say. The MLX route quantizes the 16-bit MLX conversion with
mlx-lm; the safetensors → GGUF route must reproduce the F16 GGUF it came from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend
from llmrun.formats.gguf_header import read_header
from llmrun.formats.gguf_quantize import quant_type, quantize_gguf
from llmrun.formats.memory import parameter_count
from llmrun.quantize.evaluate import QualityReport, describe, evaluate
from llmrun.quantize.texts import eval_text
from tests.support.helpers import interruptible, invoke

pytestmark = pytest.mark.slow

TYPES = ("Q8_0", "Q4_K_M")


@pytest.fixture(scope="module")
def quantized(gemma_f16: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("quantized")
    return {t: quantize_gguf(gemma_f16, out / f"gemma-{t}.gguf", quant_type(t, None)).path for t in TYPES}


@pytest.fixture(scope="module")
def reports(gemma_f16: Path, quantized: dict[str, Path]) -> dict[str, QualityReport]:
    reference = describe("f16", gemma_f16)
    return {
        t: evaluate(reference, describe(t, path), eval_text(), text_name="built-in", max_tokens=512, threads=2)
        for t, path in quantized.items()
    }


def _error(code: int, err: str, *needles: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


# --- the F16 source -------------------------------------------------------------------


def test_f16_conversion_dequantizes_every_tensor_and_keeps_the_model(gemma_cache: Path, gemma_f16: Path) -> None:
    source, f16 = read_header(gemma_cache), read_header(gemma_f16)
    assert f16.metadata["general.file_type"] == 1
    assert {t.name for t in f16.tensors} == {t.name for t in source.tensors}
    for tensor in f16.tensors:
        assert tensor.type_name == ("F32" if len(tensor.shape) == 1 else "F16"), tensor.name
    kept = {k for k in source.metadata if k != "general.file_type"}
    assert kept <= set(f16.metadata)
    assert f16.chat_template == source.chat_template
    # F16 holds the dequantized Q4_K_M weights exactly; what differs is llama.cpp's arithmetic (a Q4_K
    # matrix product quantizes the activations to 8 bits first), measured at a mean KL of about 0.004
    report = evaluate(
        describe("q4", gemma_cache), describe("f16", gemma_f16), eval_text(), text_name="t", max_tokens=256, threads=2
    )
    assert report.comparison.mean_kl < 0.01
    assert report.comparison.top1_agreement >= 0.95


# --- GGUF → GGUF through llama.cpp --------------------------------------------------


def test_sizes_fall_in_the_expected_ranges(gemma_f16: Path, quantized: dict[str, Path]) -> None:
    params = parameter_count(read_header(gemma_f16))
    bits = {t: p.stat().st_size * 8 / params for t, p in quantized.items()}
    assert 15.5 < gemma_f16.stat().st_size * 8 / params < 16.5
    assert 8.3 < bits["Q8_0"] < 9.0
    assert 4.5 < bits["Q4_K_M"] < 8.0  # Gemma's tied 262k-token embedding stays Q6_K in Q4_K_M
    assert bits["Q4_K_M"] < bits["Q8_0"]
    assert read_header(quantized["Q8_0"]).metadata["general.file_type"] == 7
    assert read_header(quantized["Q4_K_M"]).metadata["general.file_type"] == 15


def test_quality_follows_the_bits(reports: dict[str, QualityReport]) -> None:
    q8, q4 = reports["Q8_0"].comparison, reports["Q4_K_M"].comparison
    assert q8.positions == q4.positions == 511
    assert q8.mean_kl < q4.mean_kl
    assert q8.top1_agreement >= 0.95
    assert q8.perplexity_reference == q4.perplexity_reference
    assert abs(q8.perplexity_candidate / q8.perplexity_reference - 1) < 0.02
    assert reports["Q4_K_M"].size_ratio < reports["Q8_0"].size_ratio < 0.6


def test_quantized_models_load_and_generate(quantized: dict[str, Path]) -> None:
    for path in quantized.values():
        code, out, err = invoke(["run", "-m", str(path), "-t", "0", "-n", "8", "--raw", "The capital of France is"])
        assert code == 0, err
        assert out.strip()


def test_quantize_registers_the_result_and_reports(gemma_f16: Path, hermetic_env: Path) -> None:
    args = ["quantize", str(gemma_f16), "--type", "q8_0", "--name", "gemma-q8", "--tokens", "64", "--json"]
    code, out, err = invoke(args)
    assert code == 0, err
    result = json.loads(out)
    assert result["name"] == "gemma-q8"
    assert result["type"] == "Q8_0"
    assert Path(result["path"]).parent == hermetic_env / "models" / "made"
    report = result["report"]
    assert report["reference"]["type"] == "F16"
    assert report["candidate"]["type"] == "Q8_0"
    assert report["positions"] == 63
    assert 0 < report["mean_kl"] < 0.05
    assert "registered as gemma-q8" in err
    code, out, err = invoke(["run", "-m", "gemma-q8", "-t", "0", "-n", "4", "--raw", "Hello"])
    assert code == 0, err
    listed = {m["name"]: m for m in json.loads(invoke(["list", "--json"])[1])}
    assert listed["gemma-q8"]["format"] == "gguf"
    assert "made here" in listed["gemma-q8"]["repo"]
    code, out, err = invoke(["eval", "gemma-q8", "--tokens", "32", "--json"])  # the recorded source is the reference
    assert code == 0, err
    assert json.loads(out)["reference"]["path"] == str(gemma_f16)
    code, _, err = invoke(["rm", "gemma-q8", "--yes"])
    assert code == 0, err
    assert not Path(result["path"]).exists()
    assert gemma_f16.exists()  # the source is never touched


def test_default_name_output_and_force(gemma_f16: Path, tmp_path: Path, hermetic_env: Path) -> None:
    source = tmp_path / "gemma-270m-F16.gguf"
    os.link(gemma_f16, source)
    code, _, err = invoke(["quantize", str(source), "--bits", "4", "--no-eval"])
    assert code == 0, err
    assert (hermetic_env / "models" / "made" / "gemma-270m-q4_k_m.gguf").is_file()
    assert "registered as gemma-270m-q4_k_m" in err
    code, _, err = invoke(["quantize", str(source), "--bits", "4", "--no-eval"])
    _error(code, err, "gemma-270m-q4_k_m is already in the local store", "--force")
    code, _, err = invoke(["quantize", str(source), "--bits", "4", "--no-eval", "--force"])
    assert code == 0, err


def test_requantizing_needs_the_flag_and_says_so(quantized: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "q4_0.gguf"
    code, _, err = invoke(["quantize", str(quantized["Q8_0"]), "--type", "Q4_0", "--no-eval", "-o", str(out)])
    _error(code, err, "already quantized (Q8_0)", "--allow-requantize")
    assert not out.exists()
    args = ["quantize", str(quantized["Q8_0"]), "--type", "Q4_0", "--no-eval", "-o", str(out), "--allow-requantize"]
    code, _, err = invoke(args)
    assert code == 0, err
    assert "requantized from Q8_0" in err
    assert read_header(out).metadata["general.file_type"] == 2


def _imatrix(f16: Path, path: Path, wrong_size: bool = False) -> None:
    """A GGUF importance matrix (llama-imatrix's format) of ones for every matrix of the model."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "imatrix")
    for tensor in read_header(f16).tensors:
        if len(tensor.shape) == 2:
            n_per_row = tensor.shape[0] + (1 if wrong_size else 0)
            writer.add_tensor(f"{tensor.name}.in_sum2", np.ones((1, n_per_row), dtype=np.float32))
            writer.add_tensor(f"{tensor.name}.counts", np.ones((1, 1), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_an_importance_matrix_reaches_llama_cpp(gemma_f16: Path, quantized: dict[str, Path], tmp_path: Path) -> None:
    imatrix = tmp_path / "ones.imatrix.gguf"
    _imatrix(gemma_f16, imatrix)
    out = tmp_path / "q4.gguf"
    code, _, err = invoke(["quantize", str(gemma_f16), "--type", "Q4_K_M", "--imatrix", str(imatrix), "--no-eval",
                           "-o", str(out), "--name", "with-imatrix"])  # fmt: skip
    assert code == 0, err
    assert out.stat().st_size == quantized["Q4_K_M"].stat().st_size  # same types …
    assert out.read_bytes() != quantized["Q4_K_M"].read_bytes()  # … chosen with other weights
    bad = tmp_path / "bad.imatrix.gguf"
    _imatrix(gemma_f16, bad, wrong_size=True)
    code, _, err = invoke(["quantize", str(gemma_f16), "--type", "Q4_K_M", "--imatrix", str(bad), "--no-eval",
                           "-o", str(tmp_path / "bad.gguf"), "--name", "bad-imatrix"])  # fmt: skip
    _error(code, err, "llama.cpp could not quantize")
    assert not (tmp_path / "bad.gguf").exists()
    assert not list(tmp_path.glob(".llmrun-partial-*"))


def test_ctrl_c_stops_the_quantizer_and_leaves_nothing(gemma_f16: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "gemma-q4.gguf"
    process = subprocess.Popen(
        [sys.executable, "-m", "llmrun", "quantize", str(gemma_f16), "--type", "Q4_K_M", "--no-eval", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    assert process.stderr is not None
    lines = []
    for line in process.stderr:  # plain progress lines off a terminal
        lines.append(line)
        if line.startswith("quantize to Q4_K_M:"):
            break
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=60)
    err = "".join(lines) + rest
    _error(process.returncode, err)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir()]  # no staged file left beside it


# --- bad input -------------------------------------------------------------------------


def test_bad_input_gets_one_clear_line(gemma: Path, tmp_path: Path) -> None:
    code, _, err = invoke(["quantize", "gemma3:270m", "--type", "Q9_Z"])
    _error(code, err, "unknown quantization type 'Q9_Z'", "Q4_K_M", "Q8_0")
    code, _, err = invoke(["quantize", "./missing.gguf"])
    _error(code, err, "does not exist")
    (tmp_path / "empty").mkdir()
    code, _, err = invoke(["quantize", str(tmp_path / "empty")])
    _error(code, err, "is not a model directory")
    existing = tmp_path / "taken.gguf"
    existing.write_text("mine")
    code, _, err = invoke(["quantize", "gemma3:270m", "--allow-requantize", "-o", str(existing), "--no-eval"])
    _error(code, err, "already exists")
    assert existing.read_text() == "mine"
    code, _, err = invoke(["quantize", "gemma3:270m", "--format", "mlx", "--type", "Q4_K_M"])
    _error(code, err, "--type names a GGUF quantization type")
    code, _, err = invoke(["quantize", "gemma3:270m", "--bits", "5"])
    _error(code, err, "--bits must be 4 or 8")
    hostile = tmp_path / "hostile.gguf"
    hostile.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**62).to_bytes(8, "little") + bytes(8))
    code, _, err = invoke(["quantize", str(hostile), "--no-eval"])
    _error(code, err, "hostile.gguf")
    code, _, err = invoke(["eval", "gemma3:270m"])
    _error(code, err, "no recorded source", "--ref")
    code, _, err = invoke(["eval", "gemma3:270m", "--ref", "gemma3:270m", "--text", str(tmp_path / "none.txt")])
    _error(code, err, "does not exist")
    code, _, err = invoke(["convert", "gemma3:270m", "--to", "gguf", "--type", "q4"])
    _error(code, err, "--type must be one of f16, bf16, f32")
    assert not list(tmp_path.glob(".llmrun-partial-*"))


def test_eval_compares_any_two_models_of_one_vocabulary(gemma: Path, gemma_f16: Path) -> None:
    code, out, err = invoke(["eval", "gemma3:270m", "--ref", str(gemma_f16), "--tokens", "48"])
    assert code == 0, err
    assert "mean KL divergence" in out
    assert "top-1 agreement" in out
    assert "47 positions" in out


# --- safetensors → GGUF, and the MLX route ------------------------------------------------


def test_safetensors_directory_becomes_the_same_gguf(gemma_mlx16: Path, gemma_f16: Path, tmp_path: Path) -> None:
    from llmrun.formats.hf_gguf import hf_to_gguf

    written = hf_to_gguf(gemma_mlx16, tmp_path / "from-safetensors.gguf")
    header = read_header(written.path)
    assert header.architecture == "gemma3"
    assert header.chat_template == read_header(gemma_f16).chat_template
    vocab = LoadParams(64, 2, 0, vocab_only=True)
    ours, theirs = GgufBackend().load(written.path, vocab), GgufBackend().load(gemma_f16, vocab)
    for text in (eval_text(), "  two  spaces\n\ttab", "안녕하세요 🦜", "<start_of_turn>user\nhi<end_of_turn>"):
        for special in (False, True):
            assert ours.tokenize(text, special=special, add_bos=True) == theirs.tokenize(
                text, special=special, add_bos=True
            )
    assert (ours.bos_id, ours.eos_id, ours.adds_bos) == (theirs.bos_id, theirs.eos_id, theirs.adds_bos)
    reference, candidate = describe("f16", gemma_f16), describe("ours", written.path)
    report = evaluate(reference, candidate, eval_text(), text_name="t", max_tokens=256, threads=2)
    assert report.comparison.mean_kl < 1e-3  # bfloat16 rounding of the same weights
    assert report.comparison.top1_agreement >= 0.98


def test_safetensors_directory_quantized_to_gguf(gemma_mlx16: Path, tmp_path: Path) -> None:
    source = tmp_path / "gemma-270m"
    shutil.copytree(gemma_mlx16, source)
    args = ["quantize", str(source), "--format", "gguf", "--type", "Q8_0", "--tokens", "64", "--json"]
    code, out, err = invoke(args)
    assert code == 0, err
    result = json.loads(out)
    assert result["name"] == "gemma-270m-q8_0"
    assert "wrote an F16 GGUF" in err
    assert result["report"]["reference"]["type"] == "F16"
    assert result["report"]["mean_kl"] < 0.05
    assert not list(Path(result["path"]).parent.glob(".llmrun-f16-*"))  # the F16 intermediate is gone


def test_mlx_quantization_follows_the_bits(gemma_mlx16: Path, tmp_path: Path) -> None:
    kl = {}
    for bits in (8, 4):
        args = ["quantize", str(gemma_mlx16), "--bits", str(bits), "--tokens", "40", "--json", "--name", f"m{bits}"]
        code, out, err = invoke([*args, "-o", str(tmp_path / f"m{bits}")])
        assert code == 0, err
        result = json.loads(out)
        config = json.loads((tmp_path / f"m{bits}" / "config.json").read_text())
        assert config["quantization"]["bits"] == bits
        assert result["report"]["candidate"]["type"] == f"mlx {bits}-bit"
        kl[bits] = result["report"]["mean_kl"]
    assert kl[8] < kl[4]
    code, out, err = invoke(["run", "-m", "m4", "-t", "0", "-n", "4", "--raw", "--show-params", "Hello"])
    assert code == 0, err
    assert "auto: the model is an MLX directory" in err


def test_gguf_to_mlx_through_quantize(gemma: Path, tmp_path: Path) -> None:
    out = tmp_path / "gemma-mlx8"
    code, _, err = invoke(["quantize", "gemma3:270m", "--format", "mlx", "--bits", "8", "--no-eval", "-o", str(out)])
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    assert "registered as gemma3:270m-mlx-8bit" in err
