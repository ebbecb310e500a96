import pytest
import torch

from posenc_bench.encodings.alibi import ALiBi, alibi_slopes


def test_eight_heads_slopes_are_powers_of_one_half():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32])
def test_slopes_match_transformers_bloom(n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # Bloom's alibi tensor for an all-ones mask is slope * position, so position 1 gives the slopes
    alibi = build_alibi_tensor(torch.ones(1, 2), n, torch.float32).reshape(n, 2)
    assert torch.allclose(alibi_slopes(n), alibi[:, 1], rtol=1e-6)


def test_non_power_of_two_follows_the_paper():
    # 12 heads: the 8-head slopes, then every other slope of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(0.5 + i) for i in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected))


def test_bias_is_minus_slope_times_distance():
    enc = ALiBi(d_model=32, n_heads=4, train_len=8)
    pos = torch.arange(10)
    b = enc.bias(pos, pos)
    assert b.shape == (1, 4, 10, 10)
    slopes = alibi_slopes(4)
    for h in range(4):
        assert b[0, h, 7, 2] == pytest.approx(-slopes[h] * 5)
        assert b[0, h, 3, 3] == 0
    # a query chunk sees the same values as the full matrix
    assert torch.equal(enc.bias(pos[6:9], pos[:9]), b[:, :, 6:9, :9])
