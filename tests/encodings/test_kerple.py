"""KERPLE: the paper's two kernels entry by entry, exact (unclamped) past any band, the authors' init range."""

import math

import pytest
import torch

from posenc_bench import encodings


def build(name, heads=3):
    torch.manual_seed(0)
    return encodings.build(name, d_model=4 * heads, n_heads=heads, train_len=8)


@pytest.mark.parametrize("name", ["kerple", "kerple-power"])
def test_bias_is_the_papers_kernel_entry_by_entry(name):
    enc = build(name)
    r1, r2 = enc.r1().tolist(), enc.r2().tolist()
    pos = torch.arange(40)  # 5x the train length: nothing saturates
    b = enc.bias(pos, pos)[0]
    for h in range(3):
        for i in (0, 1, 7, 39):
            for j in range(0, i + 1, 3):
                d = i - j
                want = -r1[h] * math.log(1 + r2[h] * d) if name == "kerple" else -r1[h] * d ** r2[h]
                assert b[h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6), (h, i, j)


@pytest.mark.parametrize("name", ["kerple", "kerple-power"])
def test_toeplitz_view_equals_every_pair_and_batched_positions(name):
    enc = build(name)
    q, k = torch.arange(20, 30), torch.arange(5, 30)
    direct = enc.kernel((q[:, None] - k[None, :]).clamp(min=0).flatten()).view(3, 10, 25)
    assert torch.allclose(enc.bias(q, k)[0], direct)
    pos = torch.tensor([[0, 3, 9, 20], [1, 2, 4, 8]])
    b = enc.bias(pos, pos)  # (B, H, T, T)
    assert b.shape == (2, 3, 4, 4)
    assert torch.allclose(b[1, :, 3, 0], enc.kernel(torch.tensor([7])).flatten())


def test_init_follows_the_authors_ranges_and_constraints():
    for name in ("kerple", "kerple-power"):
        enc = build(name, heads=64)
        assert 0.01 <= enc.r1().min() and enc.r1().max() <= 2.0 + 1e-5
        assert 0.01 <= enc.r2().min() and enc.r2().max() <= 1.0 + 1e-5
    power = build("kerple-power")
    with torch.no_grad():
        power.raw_r2.fill_(50.0)
    assert power.r2().max() <= 2.0  # r2 never leaves (0, 2]


def test_power_kernel_gradient_is_finite_at_distance_zero():
    enc = build("kerple-power")
    enc.bias(torch.arange(6), torch.arange(6)).sum().backward()
    assert torch.isfinite(enc.raw_r2.grad).all() and torch.isfinite(enc.raw_r1.grad).all()


@pytest.mark.parametrize("name", ["kerple", "kerple-power"])
def test_distance_bias_is_the_bias_at_every_distance_of_the_window(name):
    """The contract of the distance_bias training path: bias(i, j) = r[h, min(i - j, W)] for every visible pair
    of a window of T tokens, and W = T - 1, so no distance is clamped."""
    enc = encodings.build(name, d_model=32, n_heads=4, train_len=16)
    T = 50
    r = enc.distance_bias(T)
    assert r.shape == (4, T)
    pos = torch.arange(T)
    b = enc.bias(pos, pos)[0]  # (H, T, T)
    i, j = torch.tril_indices(T, T)
    torch.testing.assert_close(b[:, i, j], r[:, i - j], rtol=0, atol=0)
