"""xPos: RoPE's rotation with q scaled by zeta^(n/B) and k by zeta^(-m/B), from the paper's formula pair by
pair; blockwise causal attention of xpos+bca."""

import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model.transformer import DecoderLM


def test_zeta_and_scale_base_are_the_papers():
    enc = encodings.build("xpos", d_model=16, n_heads=2, train_len=8)  # head_dim 8: 4 pairs
    assert enc.scale_base == 512.0
    assert enc.zeta.tolist() == pytest.approx([(i / 4 + 0.4) / 1.4 for i in range(4)])


def test_logits_follow_the_formula_pair_by_pair():
    torch.manual_seed(0)
    D, T = 8, 300
    enc = encodings.build("xpos", d_model=D, n_heads=1, train_len=8, options={"scale_base": 64.0})
    q, k = torch.randn(1, 1, T, D, dtype=torch.float64), torch.randn(1, 1, T, D, dtype=torch.float64)
    qr, kr = enc.rotate(q.float(), k.float(), torch.arange(T))
    got = (qr @ kr.transpose(-1, -2))[0, 0]
    for n, m in [(0, 0), (299, 0), (150, 149), (10, 290), (77, 3)]:
        want = 0.0
        for i in range(D // 2):
            theta = 10000 ** (-2 * i / D)
            zeta = (i / (D / 2) + 0.4) / 1.4
            a = complex(q[0, 0, n, i], q[0, 0, n, i + D // 2]) * complex(math.cos(n * theta), math.sin(n * theta))
            b = complex(k[0, 0, m, i], k[0, 0, m, i + D // 2]) * complex(math.cos(m * theta), math.sin(m * theta))
            want += (a * b.conjugate()).real * zeta ** ((n - m) / 64)
        assert got[n, m].item() == pytest.approx(want, rel=1e-4, abs=1e-4), (n, m)


def test_batched_positions_equal_one_row_at_a_time():
    torch.manual_seed(0)
    enc = encodings.build("xpos", d_model=16, n_heads=2, train_len=8)
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    pos = torch.tensor([[0, 3, 9, 20, 21], [4, 5, 6, 7, 100]])
    qb, kb = enc.rotate(q, k, pos)
    for b in range(2):
        qr, kr = enc.rotate(q[b:b + 1], k[b:b + 1], pos[b].clone())
        assert torch.allclose(qb[b:b + 1] @ kb[b:b + 1].transpose(-1, -2), qr @ kr.transpose(-1, -2), atol=1e-5)


def test_bca_is_xpos_up_to_the_train_length_and_blockwise_past_it():
    from posenc_bench.model.transformer import ModelConfig

    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)  # one layer: the visible set is the receptive field
    plain = DecoderLM(cfg, "xpos", 16, seed=0).eval()
    bca = DecoderLM(cfg, "xpos+bca", 16, seed=0).eval()
    x = torch.randint(0, 256, (1, 64))
    with torch.no_grad():
        assert torch.equal(plain(x[:, :16]), bca(x[:, :16]))
        out = bca(x)
        # block 8: query 40 sees keys 32 .. 40 only, so tokens before 32 do not change its output
        y = x.clone()
        y[:, :32] = torch.randint(0, 256, (1, 32))
        assert torch.allclose(bca(y)[:, 40:48], out[:, 40:48], atol=1e-5)
        assert not torch.allclose(bca(y)[:, 39], out[:, 39])  # block 4 (32..39) sees block 3 (24..31)
    assert bca.encoding.attention_block(64) == 8 and bca.encoding.attention_block(16) is None


def test_bca_block_is_the_papers_half_of_the_train_length_and_an_option():
    """Sun et al. 2023, sec. 3.3: pre-training length l, blocks of l/2 (their l = 1024: blocks of 512)."""
    build = lambda L, **o: encodings.build("xpos+bca", d_model=32, n_heads=4, train_len=L, options=o)  # noqa: E731
    assert build(1024).block == 512 and build(512).block == 256 and build(1).block == 1
    assert build(512, block=64).attention_block(1024) == 64
    assert encodings.get_class("xpos+bca").key_options(512, {"block": 64}) == {}  # eval-only: the xpos weights
