"""The FLOP count and the device peaks behind the MFU of `posenc-bench time` and benchmarks/gpu_check.py."""

import pytest

from posenc_bench.bench.timing.mfu import PEAK_TFLOPS, mfu, peak_flops, step_flops
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def test_step_flops_is_six_n_d_plus_causal_attention():
    cfg = ModelConfig()
    model = DecoderLM(cfg, "nope", 64, seed=0)
    # N: the matrices (q/k/v, output, MLP, the tied embedding as the LM head); biases and norms not counted
    weights = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    assert weights == 4 * (4 + 2 * 4) * 128 * 128 + 128 * 257
    B, T = 3, 2048
    attention = 12 * cfg.n_layers * cfg.d_model * T * T / 2 * B
    assert step_flops(cfg, B, T) == pytest.approx(6 * weights * B * T + attention, rel=1e-12)
    assert step_flops(cfg, 2 * B, T) == pytest.approx(2 * step_flops(cfg, B, T))


@pytest.mark.parametrize("gpu,precision,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.0), ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
    ("NVIDIA H100 PCIe", "bf16", 756.0), ("NVIDIA H100 NVL", "bf16", 835.0), ("NVIDIA H200", "bf16", 989.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A10", "bf16", 125.0), ("NVIDIA L40S", "bf16", 362.0),
    ("NVIDIA L40", "bf16", 181.0), ("NVIDIA L4", "fp32", 30.3),
])
def test_peak_flops_matches_the_most_specific_name(gpu, precision, tflops):
    peak, source = peak_flops(gpu, precision)
    assert peak == tflops * 1e12 and f"{tflops:g} TFLOP/s" in source


def test_peak_flops_without_a_figure_says_why_and_the_override_wins_on_cuda_only():
    assert peak_flops("Tesla T4", "bf16") == (None, "no peak known for 'Tesla T4' at bf16: give --peak-tflops")
    assert peak_flops(None, "bf16", 100.0) == (None, "no MFU on the CPU")
    assert peak_flops("Tesla T4", "bf16", 65.0) == (65e12, "given: 65 TFLOP/s")
    assert peak_flops("NVIDIA H200", "bf16", 790.0)[0] == 790e12
    assert all(set(peaks) == {"fp32", "bf16"} for _, _, peaks in PEAK_TFLOPS)


def test_mfu_is_achieved_over_peak():
    assert mfu(3e12, 2.0, 3e12) == pytest.approx(0.5)
    assert mfu(3e12, 2.0, None) is None and mfu(3e12, 0.0, 1e12) is None
