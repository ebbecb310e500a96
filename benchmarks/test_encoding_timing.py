"""Generation and application cost of every encoding, one table per length (pytest-benchmark groups).

pytest benchmarks/test_encoding_timing.py --benchmark-only --benchmark-group-by=group
Generation groups hold our builders next to the references (the textbook sinusoidal table, transformers'
LlamaRotaryEmbedding) and the floor (writing the output; one fp32 sin per value). Application groups hold one
attention layer's forward per encoding; read each as a ratio to `nope` (the fused causal path) in the same
table. `posenc-bench time` reports the same ratios in one file.
"""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.bench.eval.memory import bias_as_mask
from posenc_bench.encodings.absolute import sinusoidal_table
from posenc_bench.encodings.rope import default_inv_freq, rope_cos_sin_halves
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import CausalSelfAttention, ModelConfig
from posenc_bench.bench.timing.references import floor_fns, hf_rotary, textbook_sinusoidal

D_MODEL, HEAD_DIM = 512, 128


def dims(fast):
    return (32, 16) if fast else (D_MODEL, HEAD_DIM)


@pytest.mark.parametrize("what", ["ours", "textbook", "floor: write", "floor: sin"])
def test_sinusoidal_table(benchmark, gen_length, fast, what):
    d, _ = dims(fast)
    benchmark.group = f"sinusoidal table {gen_length} x {d} fp32"
    write, sin = floor_fns(gen_length * d, gen_length * d, "cpu")
    fn = {"ours": lambda: sinusoidal_table(gen_length, d), "textbook": lambda: textbook_sinusoidal(gen_length, d),
          "floor: write": write, "floor: sin": sin}[what]
    out = benchmark(fn)
    if what != "floor: sin":
        assert out.shape[0] == gen_length * (d if what.startswith("floor") else 1)


@pytest.mark.parametrize("what", ["ours", "transformers", "floor: write", "floor: sin"])
def test_rope_cache(benchmark, gen_length, fast, what):
    _, D = dims(fast)
    benchmark.group = f"RoPE cos/sin cache {gen_length} x {D}"
    pos = torch.arange(gen_length)
    inv, scale = default_inv_freq(D)
    write, sin = floor_fns(gen_length * D, gen_length * D, "cpu")
    fn = {"ours": lambda: rope_cos_sin_halves(pos, inv, scale), "transformers": hf_rotary(D, gen_length, "cpu"),
          "floor: write": write, "floor: sin": sin}[what]
    benchmark(fn)


@pytest.mark.parametrize("name", encodings.trained() + ["alibi (explicit bias)"])
def test_attention_forward(benchmark, attn_length, fast, name):
    d, D = dims(fast)
    H = d // D
    benchmark.group = f"attention layer forward, L={attn_length}, {H} heads x {D}"
    torch.manual_seed(0)
    layer = CausalSelfAttention(ModelConfig(d_model=d, n_heads=H, n_layers=1)).eval()
    enc = encodings.build(name.split()[0], d_model=d, n_heads=H, train_len=attn_length)
    if name.endswith("(explicit bias)"):
        bias_as_mask(enc)
    pos = torch.arange(attn_length)
    x = enc.embed(torch.randn(1, attn_length, d), pos)

    def fwd():
        with torch.no_grad():
            return layer(x, enc, AttentionPlan(enc, pos, None, 64 << 20))

    y = benchmark(fwd)
    assert y.shape == (1, attn_length, d) and torch.isfinite(y).all()
