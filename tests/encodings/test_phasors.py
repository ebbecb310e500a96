import math

import pytest
import torch

from posenc_bench.encodings.phasors import BLOCK, unit_phasors


def reference(length, freqs, start=0, sign=1.0, phase=0.0, scale=1.0):
    angles = phase + sign * torch.arange(start, start + length, dtype=torch.float64)[:, None] * freqs.double()
    return torch.stack((angles.cos(), angles.sin()), -1) * scale


@pytest.mark.parametrize("length", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 5000])
def test_matches_float64_reference(length):
    freqs = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    out = unit_phasors(length, freqs)
    assert out.shape == (length, 32, 2) and out.dtype == torch.float32 and out.is_contiguous()
    if length:
        assert (out.double() - reference(length, freqs)).abs().max() < 3e-7


def test_start_sign_phase_and_scale():
    freqs = torch.tensor([1.0, 0.37, 1e-3], dtype=torch.float32)  # float32 frequencies are taken exactly
    out = unit_phasors(300, freqs, start=8000, sign=-1.0, phase=math.pi / 2, scale=0.5)
    ref = reference(300, freqs, start=8000, sign=-1.0, phase=math.pi / 2, scale=0.5)
    assert (out.double() - ref).abs().max() < 2e-7


def test_a_positions_value_does_not_depend_on_the_table_length():
    freqs = torch.rand(16, dtype=torch.float64)
    assert torch.equal(unit_phasors(100, freqs), unit_phasors(1000, freqs)[:100])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_matches_cpu():
    freqs = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    gpu = unit_phasors(4096, freqs, device="cuda")
    assert gpu.device.type == "cuda"
    assert (gpu.cpu().double() - reference(4096, freqs)).abs().max() < 3e-7
