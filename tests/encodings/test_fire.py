"""FIRE: b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), entry by entry; the paper's defaults."""

import math

import pytest
import torch

from posenc_bench import encodings


def build(**options):
    torch.manual_seed(0)
    return encodings.build("fire", d_model=16, n_heads=2, train_len=64, options=options)


def mlp_by_hand(enc, u):
    """f_theta(u) for a scalar u: Linear(1, width) -> ReLU -> Linear(width, H), written out."""
    w1, b1 = enc.mlp[0].weight[:, 0].tolist(), enc.mlp[0].bias.tolist()
    w2, b2 = enc.mlp[2].weight.tolist(), enc.mlp[2].bias.tolist()
    hidden = [max(0.0, a * u + b) for a, b in zip(w1, b1)]
    return [sum(w * x for w, x in zip(row, hidden)) + b for row, b in zip(w2, b2)]


def test_defaults_are_the_papers():
    enc = build()
    assert enc.mlp[0].out_features == 32 and enc.c.item() == pytest.approx(0.1)
    assert enc.threshold().item() == 16.0  # L_init = train length / 4 (512 at the paper's 2048)
    assert build(threshold=100.0).threshold().item() == 100.0


def test_bias_is_the_papers_formula_entry_by_entry():
    enc = build(threshold=10.0, c_init=0.3)
    pos = torch.arange(200)  # past the train length: i > L normalises by psi(i)
    b = enc.bias(pos[150:], pos)[0]  # (H, 50, 200)
    psi = lambda x: math.log(0.3 * x + 1)  # noqa: E731
    for i in (150, 151, 199):
        for j in (0, 7, 120, i):
            want = mlp_by_hand(enc, psi(i - j) / (psi(max(10.0, i)) + 1e-6))
            for h in range(2):
                assert b[h, i - 150, j].item() == pytest.approx(want[h], rel=1e-4, abs=1e-5), (i, j, h)
    small = enc.bias(torch.arange(5), torch.arange(5))[0]  # i < L: normalised by psi(L)
    want = mlp_by_hand(enc, psi(3) / (psi(10.0) + 1e-6))
    assert small[:, 4, 1].tolist() == pytest.approx(want, rel=1e-4)


def test_normalised_distance_stays_in_unit_interval_at_any_length():
    enc = build()
    pos = torch.arange(2000)
    u = enc.normalized_distance(pos[-8:], pos)
    assert u.min() >= 0 and u.max() <= 1


def test_row_blocks_equal_one_call_and_batched_positions():
    from posenc_bench.encodings import fire

    enc = build()
    pos = torch.arange(300)
    whole = enc.bias(pos, pos)
    old = fire.HIDDEN_ELEMENTS
    fire.HIDDEN_ELEMENTS = 32 * 300 * 7  # 7 rows per MLP call
    try:
        assert torch.allclose(enc.bias(pos, pos), whole)
    finally:
        fire.HIDDEN_ELEMENTS = old
    batched = torch.tensor([[0, 5, 40, 90], [2, 3, 4, 5]])
    b = enc.bias(batched, batched)
    assert b.shape == (2, 2, 4, 4)
    assert torch.allclose(b[0], enc.bias(batched[0], batched[0])[0])
