"""p-RoPE (Barbero et al. 2025): the highest int(p D // 2) frequency pairs rotate with RoPE's full-width
frequencies, the rest pass unchanged; not transformers' partial_rotary_factor."""

import pytest
import torch

from posenc_bench import encodings


def test_frequencies_are_the_full_width_spectrum_truncated():
    enc = encodings.build("rope-partial", d_model=64, n_heads=2, train_len=8)  # head_dim 32: 16 pairs
    assert enc.fraction == 0.75
    kept = int(0.75 * 32 // 2)
    want = [10000 ** (-2 * i / 32) if i < kept else 0.0 for i in range(16)]
    assert enc.inv_freq.tolist() == pytest.approx(want, rel=1e-6)
    # transformers' partial_rotary_factor recomputes over p D dims: its lowest frequency is 10000^-(1 - 2/(pD))
    hf_lowest = 10000 ** (-2 * (kept - 1) / (0.75 * 32))
    assert enc.inv_freq[kept - 1].item() != pytest.approx(hf_lowest, rel=1e-3)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_rotated_pairs_match_rope_and_the_rest_pass_bitwise(fraction):
    torch.manual_seed(0)
    D, T = 16, 50
    part = encodings.build("rope-partial", d_model=D, n_heads=1, train_len=8, options={"fraction": fraction})
    rope = encodings.build("rope", d_model=D, n_heads=1, train_len=8)
    q, k = torch.randn(1, 1, T, D), torch.randn(1, 1, T, D)
    pos = torch.arange(T)
    qp, kp = part.rotate(q, k, pos)
    qr, kr = rope.rotate(q, k, pos)
    kept = int(fraction * D // 2)
    cols = [i for i in range(D // 2) if i < kept] + [D // 2 + i for i in range(D // 2) if i < kept]
    rest = [c for c in range(D) if c not in cols]
    assert torch.allclose(qp[..., cols], qr[..., cols], atol=1e-6)
    assert torch.equal(qp[..., rest], q[..., rest]) and torch.equal(kp[..., rest], k[..., rest])


def test_fraction_outside_unit_interval_is_refused():
    from posenc_bench.errors import ConfigError
    from posenc_bench.model.transformer import DecoderLM, ModelConfig

    with pytest.raises(ConfigError, match="fraction"):
        DecoderLM(ModelConfig(d_model=32, n_heads=2, n_layers=1, encoding_options={"rope-partial": {"fraction": 1.5}}),
                  "rope-partial", 8)
