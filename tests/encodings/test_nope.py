import torch

from posenc_bench.encodings.nope import NoPE


def test_nope_adds_nothing():
    enc = NoPE(d_model=16, n_heads=2, train_len=8)
    x, q, k = torch.randn(1, 5, 16), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)
    assert enc.embed(x, pos) is x
    assert enc.rotate(q, k, pos) == (q, k)
    assert enc.bias(pos, pos) is None
    assert list(enc.parameters()) == []
