"""`posenc-bench time`: bad input is one line and exit 2, before anything is timed or written (what it measures
is tested in tests/bench/timing/test_suite.py)."""

import pytest
import torch

from posenc_bench.commands.cli import main


@pytest.mark.parametrize("args,message", [
    (["--lengths", "12,abc"], "--lengths '12,abc'"),
    (["--precision", "fp8"], "precision 'fp8' is not supported here; valid: fp32, bf16"),
    (["--lengths", "0"], "lengths must be positive"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main(["time", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "timing.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["time", "--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "CUDA is not available" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--skip", "generation,gen"], "skip 'gen': the parts are generation, attention, memory, bias-memory, training, llama"),
    (["--encodings", "rope,rope-yarn"], "encodings 'rope-yarn' are not trained encodings; valid: sinusoidal"),
    (["--peak-tflops", "0"], "peak_tflops must be positive, got 0.0"),
])
def test_bad_selection_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main(["time", "--device", "cpu", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "timing.json").exists()
