"""What `posenc-bench time` measures against: the floor, the textbook table, transformers' RoPE and Llama."""

import torch

from posenc_bench.bench.timing.references import floor_fns, hf_rotary, llama_like, textbook_sinusoidal


def test_floor_writes_and_evaluates_what_it_says():
    write, sin = floor_fns(1000, 300, "cpu")
    assert write().shape == (1000,) and bool((write() == 0.5).all())
    assert sin().shape == (300,) and torch.isfinite(sin()).all()


def test_textbook_reference_is_the_tutorial_formula():
    from posenc_bench.encodings.absolute import sinusoidal_table

    assert torch.allclose(textbook_sinusoidal(100, 32), sinusoidal_table(100, 32), atol=1e-5)


def test_hf_rotary_builds_the_rope_cache():
    from posenc_bench.encodings.rope import default_inv_freq, rope_cos_sin_halves

    cos, sin = hf_rotary(16, 50, "cpu")()
    ours_cos, ours_sin = rope_cos_sin_halves(torch.arange(50), *default_inv_freq(16))
    assert cos.shape == (1, 50, 16)  # transformers builds (L, D), both halves
    assert torch.allclose(cos[0, :, :8], ours_cos, atol=1e-4) and torch.allclose(sin[0, :, 8:], ours_sin, atol=1e-4)


def test_llama_reference_matches_our_model_size():
    from posenc_bench.model.transformer import DecoderLM, ModelConfig

    cfg = ModelConfig()
    ours = sum(p.numel() for p in DecoderLM(cfg, "rope", 128).parameters())
    llama = llama_like(cfg, 128)
    theirs = sum(p.numel() for p in llama.parameters())
    assert abs(ours - theirs) / ours < 0.005
    c = llama.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size) == (128, 4, 4, 257)
    assert c.tie_word_embeddings and c._attn_implementation == "sdpa"
    assert c.use_cache is False  # a training step builds no KV cache
