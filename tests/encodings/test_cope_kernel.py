"""cope_kernel: the C kernels build where a compiler is found, take float32 CPU chunks, and equal the torch ops
they replace row by row (CoPEAttention through them, against autograd through the definition: test_cope.py)."""

import pytest
import torch
import torch.nn.functional as F

from posenc_bench import native
from posenc_bench.encodings import cope_kernel


def test_the_c_kernels_build_here_and_run_float32_on_the_cpu():
    """Where a C compiler is found the kernels build and take float32 CPU chunks; float64 stays on torch ops
    (both paths are checked against autograd above)."""
    if native._compiler() is None:
        pytest.skip("no C compiler: CoPE runs on torch ops (the tests above check that path)")
    assert cope_kernel.library() is not None, native.why_not("cope", cope_kernel.SOURCE)
    x = torch.zeros(2, 3)
    assert cope_kernel.usable(x) and not cope_kernel.usable(x.double())


def test_the_c_kernels_equal_the_torch_ops_row_by_row():
    """gates, probs_ and backward_ against the torch ops they replace, on rows with masked keys, counts that
    clamp, and a NaN that must stay a NaN (and stay in bounds)."""
    if cope_kernel.library() is None:
        pytest.skip(native.why_not("cope", cope_kernel.SOURCE))
    g = torch.Generator().manual_seed(3)
    rows, K, npos = 24, 50, 16
    x = torch.randn(rows, K, generator=g) * 3
    x[:, 40:] = float("-inf")  # masked keys: gate 0, probability 0
    gate, p = cope_kernel.gates(x, npos)
    want_g = torch.sigmoid(x)
    want_p = want_g.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)
    torch.testing.assert_close(gate, want_g, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(p, want_p, rtol=1e-6, atol=1e-6)
    assert (p == npos - 1).any() and (gate[:, 40:] == 0).all()
    n = int(p[:, 0].max()) + 1  # floor p <= npos - 1 = n - 1, where the difference is 0
    fixed = torch.randn(rows, n, generator=g)
    diff = F.pad(fixed.diff(dim=-1), (0, 1))
    floor = p.long()
    want_P = torch.softmax(x + fixed.gather(-1, floor) + (p - floor) * diff.gather(-1, floor), dim=-1)
    P = cope_kernel.probs_(x.clone(), p, fixed, diff)
    torch.testing.assert_close(P, want_P, rtol=1e-5, atol=1e-7)
    assert (P[:, 40:] == 0).all()
    dPv, delta = torch.randn(rows, K, generator=g), torch.randn(rows, 1, generator=g)
    dL = (dPv - delta) * want_P
    dfixed = torch.zeros(rows, n).scatter_add_(-1, floor, dL * (1 - (p - floor)))
    dfixed[:, 1:] += torch.zeros(rows, n).scatter_add_(-1, floor, dL * (p - floor))[:, :-1]
    want_dx = dL + (dL * diff.gather(-1, floor)).cumsum(-1) * want_g * (1 - want_g)
    dx = dPv.clone()
    got_dfixed = cope_kernel.backward_(dx, delta, want_P, want_g, p, diff)
    torch.testing.assert_close(dx, want_dx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_dfixed, dfixed, rtol=1e-5, atol=1e-6)
    x[0, 3] = float("nan")
    gate, p = cope_kernel.gates(x, npos)
    P = cope_kernel.probs_(x.clone(), p, fixed, diff)
    assert P[0].isnan().all() and not P[1:].isnan().any()


def test_without_a_compiler_cope_warns_and_keeps_its_torch_ops(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there
    native._load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="CoPE runs on torch ops, slower: no C compiler found"):
            assert not cope_kernel.usable(torch.zeros(2, 3))
    finally:
        native._load.cache_clear()
