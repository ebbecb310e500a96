"""fire_kernel: the C kernels build where a compiler is found, take float32 CPU pairs with uint8 pieces, and
equal the torch ops of fire._Lines they replace (the bias against the MLP pair by pair: test_fire.py)."""

import pytest
import torch

from posenc_bench import native
from posenc_bench.encodings import fire_kernel


def test_the_c_kernels_build_here_and_take_float32_pairs_on_the_cpu():
    if native._compiler() is None:
        pytest.skip("no C compiler: FIRE's lines run on torch ops (tested above)")
    assert fire_kernel.library() is not None, native.why_not("fire", fire_kernel.SOURCE)
    u, piece = torch.zeros(1, 2, 3), torch.zeros(1, 2, 3, dtype=torch.uint8)
    assert fire_kernel.usable(u, piece)
    assert not fire_kernel.usable(u.double(), piece) and not fire_kernel.usable(u, piece.long())


def test_lines_and_their_backward_equal_gathers_and_index_add():
    """Per pair and head values[h, s] + slopes[h, s] (u - inside[s]); du = sum_h g_h slopes[h, s]; per piece
    the sums of g_h and of g_h (u - inside[s]); with pieces that change along a row and come back."""
    if fire_kernel.library() is None:
        pytest.skip(native.why_not("fire", fire_kernel.SOURCE))
    g = torch.Generator().manual_seed(5)
    L, H, Tq, Tk, S = 2, 3, 7, 40, 6
    u = torch.rand(L, Tq, Tk, generator=g)
    piece = torch.randint(0, S, (L, Tq, Tk), generator=g, dtype=torch.uint8).sort(-1).values
    piece[0, 0, 30:] = 1  # a piece that comes back later in a row
    inside, values, slopes = (torch.rand(S, generator=g), torch.randn(H, S, generator=g),
                              torch.randn(H, S, generator=g))
    out, offset = fire_kernel.lines(u, piece, inside, values, slopes, keep=True)
    s = piece.long()
    want_offset = u - inside[s]
    want = values[:, s].movedim(0, 1) + slopes[:, s].movedim(0, 1) * want_offset[:, None]  # (L, H, Tq, Tk)
    torch.testing.assert_close(offset, want_offset, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    assert fire_kernel.lines(u, piece, inside, values, slopes, keep=False)[1] is None
    grad = torch.randn(L, H, Tq, Tk, generator=g)
    du, sums = fire_kernel.lines_backward(grad, offset, piece, slopes)
    torch.testing.assert_close(du, (grad * slopes[:, s].movedim(0, 1)).sum(1), rtol=1e-5, atol=1e-6)
    want_sums = torch.zeros(2 * H, S, dtype=torch.float64)
    flat = s.reshape(-1)
    for h in range(H):
        want_sums[h].index_add_(0, flat, grad[:, h].reshape(-1).double())
        want_sums[H + h].index_add_(0, flat, (grad[:, h].double() * offset.double()).reshape(-1))
    torch.testing.assert_close(sums, want_sums, rtol=1e-12, atol=1e-9)


def test_without_a_compiler_fire_warns_and_keeps_its_torch_ops(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native._load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="FIRE runs on torch ops, slower: no C compiler found"):
            assert not fire_kernel.usable(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3, dtype=torch.uint8))
    finally:
        native._load.cache_clear()


def test_under_bf16_autocast_the_kernels_take_the_bf16_line_tables_and_equal_the_torch_ops(monkeypatch):
    """Under CPU autocast the MLP gives its line tables in bf16; the kernels read them as float32, as the torch
    ops' type promotion does: the same bias and gradients."""
    if fire_kernel.library() is None:
        pytest.skip(native.why_not("fire", fire_kernel.SOURCE))
    from posenc_bench.encodings.fire import FIRE

    pos = torch.arange(40)
    results = []
    for kernel in (True, False):
        if not kernel:
            monkeypatch.setattr(fire_kernel, "usable", lambda u, piece: False)
        torch.manual_seed(0)
        enc = FIRE(d_model=16, n_heads=2, train_len=32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bias = enc.bias(pos, pos)
        grads = torch.autograd.grad(bias, list(enc.parameters()), torch.ones_like(bias), allow_unused=True)
        results.append((bias, grads))
    (b1, g1), (b2, g2) = results
    assert b1.dtype == b2.dtype == torch.float32
    torch.testing.assert_close(b1, b2, rtol=1e-6, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
