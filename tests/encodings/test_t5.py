import pytest
import torch

from posenc_bench.encodings.t5 import T5Bias, relative_position_bucket


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20)])
def test_buckets_match_transformers(num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    q = torch.arange(600)[:, None]
    k = torch.arange(600)[None, :]
    rel = k - q
    ours = relative_position_bucket(rel, num_buckets, max_distance)
    ref = T5Attention._relative_position_bucket(rel, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(ours, ref)


def test_bucket_structure():
    d = torch.arange(0, 1000)
    b = relative_position_bucket(-d, 32, 128)
    assert torch.equal(b[:16], torch.arange(16))  # exact buckets for small distances
    assert (b[128:] == 31).all()  # everything past max_distance shares the last bucket
    assert (b.diff() >= 0).all()


def test_bias_looks_up_per_head_values():
    enc = T5Bias(d_model=32, n_heads=4, train_len=16)
    pos = torch.arange(20)
    b = enc.bias(pos, pos)
    assert b.shape == (1, 4, 20, 20)
    w = enc.relative_attention_bias.weight  # (buckets, heads)
    assert torch.equal(b[0, :, 10, 7], w[3])
    assert torch.equal(b[0, :, 19, 19], w[0])
    # translation invariance: the same distance gives the same bias anywhere
    assert torch.equal(b[0, :, 15, 5], b[0, :, 12, 2])


def test_distance_bias_is_the_bias_by_distance():
    from posenc_bench.encodings.t5 import T5Bias

    enc = T5Bias(d_model=32, n_heads=4, train_len=16, num_buckets=8, max_distance=20)
    r = enc.distance_bias(60)
    assert r.shape == (4, 21)
    pos = torch.arange(60)
    b = enc.bias(pos, pos)[0]  # (H, 60, 60)
    # the definition: the table row of the bucket of (key - query) for every pair, future keys included
    direct = enc.relative_attention_bias(relative_position_bucket(pos[None, :] - pos[:, None], 8, 20)).permute(2, 0, 1)
    assert torch.equal(b, direct)
    for i, j in [(0, 0), (5, 2), (30, 11), (59, 39), (59, 0), (40, 19)]:
        assert torch.equal(b[:, i, j], r[:, min(i - j, 20)]), (i, j)


def test_bias_of_query_chunks_and_of_any_positions():
    enc = T5Bias(d_model=32, n_heads=4, train_len=16, num_buckets=8, max_distance=20)
    pos = torch.arange(70)
    full = enc.bias(pos, pos)
    assert torch.equal(enc.bias(pos[40:55], pos[10:55]), full[:, :, 40:55, 10:55])  # a chunk: the Toeplitz view
    odd = torch.tensor([3, 50, 7, 69])  # not consecutive: the gather path
    assert torch.equal(enc.bias(odd, pos), full[:, :, odd])
    full.sum().backward()  # gradients reach the table through the view
    assert enc.relative_attention_bias.weight.grad.abs().sum() > 0
