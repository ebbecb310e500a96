"""rnope-swa (encodings/hybrid.py): RoPE with a sliding window in the layers Cohere2 makes "sliding_attention",
NoPE with full attention in the others, and Llama 4's NoPE temperature as an option; the whole model against a
float64 forward written out layer by layer."""

import copy
import math

import pytest
import torch

from posenc_bench.encodings import build
from posenc_bench.errors import ConfigError
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def rotate(x, pos, D, theta=10000.0):
    """RoFormer's rotation in the half-split layout, from the formula: x (T, D) at positions pos (T,)."""
    inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos.double()[:, None] * inv[None, :]  # (T, D/2)
    x1, x2 = x[:, :D // 2], x[:, D // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


def reference_forward(model, idx, nope_layers, window, attn_scale=0.0, floor_scale=1):
    m = copy.deepcopy(model).double()
    B, T = idx.shape
    H, C = m.cfg.n_heads, m.cfg.d_model
    D = C // H
    pos = torch.arange(T)
    i, j = pos[:, None], pos[None, :]
    x = m.tok_emb(idx)
    for layer, block in enumerate(m.blocks):
        h = block.ln1(x)
        q, k, v = block.attn.qkv(h).split(C, dim=2)
        nope = layer in nope_layers
        visible = (j <= i) if nope else (j <= i) & (j > i - window)
        y = torch.zeros(B, T, C, dtype=torch.float64)
        for b in range(B):
            for hd in range(H):
                sl = slice(hd * D, (hd + 1) * D)
                qh, kh = q[b, :, sl], k[b, :, sl]
                if nope:
                    temp = torch.log1p(torch.floor((pos.double() + 1) / floor_scale)) * attn_scale + 1
                    qh = qh * temp[:, None]
                else:
                    qh, kh = rotate(qh, pos, D), rotate(kh, pos, D)
                logits = (qh @ kh.T / math.sqrt(D)).masked_fill(~visible, float("-inf"))
                y[b, :, sl] = torch.softmax(logits, -1) @ v[b, :, sl]
        x = x + block.attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return m.lm_head(m.ln_f(x))


CASES = [  # (options, NoPE layers of a 4-layer model, RoPE window at train length 16)
    ({}, [3], 8),
    ({"period": 2, "window": 5}, [1, 3], 5),
    ({"period": 2, "window": 5, "attn_scale": 0.1, "floor_scale": 4}, [1, 3], 5),
]


@pytest.mark.parametrize("options,nope_layers,window", CASES)
@pytest.mark.parametrize("chunked", [False, True])
def test_whole_model_equals_the_layer_by_layer_definition(options, nope_layers, window, chunked):
    """At 1x and past it (40 tokens, 2.5x), in one chunk and in small query chunks."""
    cfg = ModelConfig(d_model=32, n_layers=4, n_heads=2, encoding_options={"rnope-swa": options})
    extra = {"max_mask_bytes": 4 * 2 * 40 * 6} if chunked else {}
    model = DecoderLM(cfg, "rnope-swa", 16, seed=0, **extra).eval()
    idx = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(idx).double()
    want = reference_forward(model, idx, nope_layers, window, options.get("attn_scale", 0.0),
                             options.get("floor_scale", 16))
    assert (got - want).abs().max() < 1e-4


def test_the_layer_pattern_is_cohere2s_and_period_one_is_nope():
    transformers = pytest.importorskip("transformers")
    for n_layers, period in [(8, 4), (6, 3), (4, 2), (5, 4)]:
        config = transformers.Cohere2Config(num_hidden_layers=n_layers, sliding_window_pattern=period)
        full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
        enc = build("rnope-swa", d_model=32, n_heads=2, train_len=16, n_layers=n_layers, options={"period": period})
        assert [i for i in range(n_layers) if enc.for_layer(i).own_window is None] == full, (n_layers, period)
    # every layer NoPE: NoPE's model on the same shared weights
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, encoding_options={"rnope-swa": {"period": 1}})
    idx = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hybrid = DecoderLM(cfg, "rnope-swa", 16, seed=3).eval()(idx)
        nope = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=2), "nope", 16, seed=3).eval()(idx)
    assert torch.equal(hybrid, nope)


def test_defaults_temperature_and_refusals():
    enc = build("rnope-swa", d_model=32, n_heads=2, train_len=128, n_layers=4)
    assert (enc.period, enc.window, enc.attn_scale, enc.floor_scale) == (4, 64, 0.0, 128)  # Cohere2: 4096 of 8192
    llama4 = build("rnope-swa", d_model=32, n_heads=2, train_len=128, n_layers=4,
                   options={"attn_scale": 0.1, "floor_scale": 8192})
    pos = torch.tensor([0, 8190, 8191, 16382, 16383, 3 * 8192 - 1])
    assert torch.allclose(llama4.temperature(pos), torch.tensor([1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2),
                                                                 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(4)]))
    two = build("rnope-swa", d_model=32, n_heads=2, train_len=16, n_layers=2)  # fewer layers than period: the last
    assert [two.for_layer(i).own_window for i in range(2)] == [8, None]
    with pytest.raises(ConfigError, match="rnope-swa.*period=0"):
        DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=2, encoding_options={"rnope-swa": {"period": 0}}),
                  "rnope-swa", 16)
    with pytest.raises(ValueError, match="window=-1"):
        build("rnope-swa", d_model=32, n_heads=2, train_len=16, options={"window": -1})
