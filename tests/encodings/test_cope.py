"""CoPE: gates, counted positions and interpolated position logits against the paper's definition, built pair
by pair; chunked attention equals one chunk."""

import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def reference_logits(q, k, e, npos):
    """The paper's logits for one head, pair by pair: q (T, D), k (T, D), e (D, npos)."""
    T, D = q.shape
    out = torch.full((T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        gates = [1 / (1 + math.exp(-(q[i] @ k[t]).item() / math.sqrt(D))) for t in range(i + 1)]
        for j in range(i + 1):
            p = min(sum(gates[j:i + 1]), npos - 1)
            lo, hi = math.floor(p), math.ceil(p)
            w = p - lo
            pos_logit = (1 - w) * (q[i] @ e[:, lo]).item() + w * (q[i] @ e[:, hi]).item()
            out[i, j] = ((q[i] @ k[j]).item() + pos_logit) / math.sqrt(D)
    return out


@pytest.mark.parametrize("npos", [0, 4])
def test_logits_equal_the_pair_by_pair_definition(npos):
    torch.manual_seed(0)
    T, D = 9, 8
    enc = encodings.build("cope", d_model=2 * D, n_heads=2, train_len=8, options={"npos_max": npos})
    assert enc.npos_max == (npos or 9)  # default: train length + 1, as the authors' code
    with torch.no_grad():
        enc.pos_emb.normal_()
    q, k = torch.randn(1, 2, T, D, dtype=torch.float64) * 2, torch.randn(1, 2, T, D, dtype=torch.float64) * 2
    mask = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))[None, None]
    got = enc.attention_logits(q, k, torch.arange(T), torch.arange(T), mask, 1 / math.sqrt(D))
    for h in range(2):
        want = reference_logits(q[0, h], k[0, h], enc.pos_emb.double(), enc.npos_max)
        assert torch.allclose(got[0, h].double(), want, atol=1e-4), h


def test_chunked_attention_equals_one_chunk_and_window_masks_the_count():
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    whole = DecoderLM(cfg, "cope", 16, seed=0).eval()
    chunked = DecoderLM(cfg, "cope", 16, seed=0, max_mask_bytes=1 << 12).eval()
    x = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        for m in (whole, chunked):
            m.encoding.pos_emb.normal_(generator=torch.Generator().manual_seed(1))
        assert torch.allclose(whole(x), chunked(x), atol=1e-5)
    from posenc_bench.model.attention import AttentionPlan

    assert len(AttentionPlan(chunked.encoding, torch.arange(64), None, 1 << 12, batch=2).chunks) > 1
