"""The model as a whole: its attention equals the textbook one on SDPA's paths, windows cut what a query sees,
and shapes it cannot take are refused. The paths themselves: test_attention.py."""

import pytest
import torch

from posenc_bench.model.transformer import DecoderLM, ModelConfig
from tests.model.reference_attention import reference_attention


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5", "sinusoidal"])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("max_mask_bytes", [64 << 20, 1024])  # one chunk / many query chunks
def test_sdpa_paths_match_the_textbook_attention(name, window, max_mask_bytes):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, name, 16, window=window, seed=1, max_mask_bytes=max_mask_bytes).eval()
    x = torch.randint(0, 256, (2, 48))
    with torch.no_grad():
        ours = model(x)
        ref = reference_attention(model, x, window)
    assert torch.allclose(ours, ref, atol=2e-5), (ours - ref).abs().max()


def test_sliding_window_sees_only_the_last_w_tokens():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    model = DecoderLM(cfg, "nope", 16, window=4).eval()
    x = torch.randint(0, 256, (1, 20))
    y = x.clone()
    y[0, :12] = torch.randint(0, 256, (12,))  # change everything before position 12
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[0, 15:], b[0, 15:])  # one layer: position 15 sees 12..15 only
    assert not torch.equal(a[0, 14], b[0, 14])


def test_heads_must_divide_width():
    from posenc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="n_heads=3 does not divide model.d_model=32"):
        DecoderLM(ModelConfig(d_model=32, n_heads=3), "nope", 16)
    with pytest.raises(ConfigError, match="even head dimension"):
        DecoderLM(ModelConfig(d_model=36, n_heads=4), "rope", 16)
