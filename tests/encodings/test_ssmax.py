"""Scalable-Softmax rows (``<base>+ssmax``): the whole model against attention written out query by query with
softmax((s log n) z) over the n keys each query sees; s = 1 / log n is the base at that n; s is learned per
layer and head, starts at 1, and survives a checkpoint; rows exist only over plain q . k encodings."""

import copy
import io
import math
import re

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.bench.rows import Row
from posenc_bench.bench.train.loop import make_optimizer
from posenc_bench.bench.config import TrainConfig
from posenc_bench.encodings import ssmax
from posenc_bench.errors import ConfigError, PositionOutOfRange, UnknownEncodingError
from posenc_bench.model.transformer import DecoderLM, ModelConfig

TRAIN = 16
THETA = 10000.0


def rot(x, pos):
    """RoPE, half-split layout, written out: x (..., T, D) float64 rotated by angles pos * theta^(-2i/D)."""
    D = x.shape[-1]
    inv_freq = THETA ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[:, None] * inv_freq  # (T, D/2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


# the base's part of the reference: (q, k, pos) -> rotated q, k; RoPE written out, xPos by its own (tested) hook
BASE_ROTATIONS = {
    "nope": lambda enc, q, k, pos: (q, k),
    "rope": lambda enc, q, k, pos: (rot(q, pos), rot(k, pos)),
    "xpos": lambda enc, q, k, pos: enc.base.rotate(q, k, pos),
    "sinusoidal": lambda enc, q, k, pos: (q, k),
}


def visible(i, window):
    """The keys query i sees: [lo, i], lo = 0 or i - W + 1."""
    return 0 if window is None else max(0, i - window + 1)


def reference_forward(model, idx, window, base, n_of=lambda i, lo: i + 1 - lo):
    """The model's forward (pre-LN blocks, tied head) in float64 with attention written out query by query:
    query i's weights over its visible keys j in [lo, i] are softmax((s_lh log n + b_lh) q_i . k_j / sqrt(D)), n
    the number of those keys (``n_of``: the rule, changed only to show the test tells rules apart)."""
    m = copy.deepcopy(model).double()
    enc = m.encoding
    B, T = idx.shape
    H, C = m.cfg.n_heads, m.cfg.d_model
    D = C // H
    pos = torch.arange(T)
    x = enc.base.embed(m.tok_emb(idx), pos)
    s = enc.s.detach().view(m.cfg.n_layers, H)
    b = torch.zeros_like(s) if enc.b is None else enc.b.detach().view(m.cfg.n_layers, H)
    for layer, block in enumerate(m.blocks):
        q, k, v = block.attn.qkv(block.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        q, k = BASE_ROTATIONS[base](enc, q, k, pos)
        y = torch.zeros(B, H, T, D, dtype=torch.float64)
        for i in range(T):
            lo = visible(i, window)
            z = torch.einsum("bhd,bhjd->bhj", q[:, :, i], k[:, :, lo:i + 1]) / math.sqrt(D)  # (B, H, n)
            factor = s[layer] * math.log(n_of(i, lo)) + b[layer]  # (H,)
            w = torch.softmax(factor[None, :, None] * z, dim=-1)
            y[:, :, i] = torch.einsum("bhj,bhjd->bhd", w, v[:, :, lo:i + 1])
        x = x + block.attn.proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + block.mlp(block.ln2(x))
    return m.lm_head(m.ln_f(x))


def sharpen(model, seed=0):
    """Larger q/k/v weights (std 0.3, not 0.02): peaked attention, so a wrong n changes the output well above
    rounding."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.copy_(torch.randn(block.attn.qkv.weight.shape, generator=g) * 0.3)
    return model


def spread(model, seed=0):
    """s (and b) drawn apart, one value per layer and head: a wrong layer's or head's s shows."""
    g = torch.Generator().manual_seed(seed)
    enc = model.encoding
    with torch.no_grad():
        enc.s.copy_(0.3 + 1.2 * torch.rand(enc.s.shape, generator=g))
        if enc.b is not None:
            enc.b.copy_(torch.randn(enc.b.shape, generator=g) * 0.5)
    return model


def tokens(T, seed=1):
    return torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(seed))


CASES = [("nope", None, {}), ("nope", 6, {}), ("rope", None, {}), ("rope", 6, {}), ("rope", 6, {"scale_bias": True}),
         ("xpos", 6, {}), ("sinusoidal", None, {"scale_bias": True})]


@pytest.mark.parametrize("base,window,options", CASES, ids=[f"{b}-sw{w}-{o}" for b, w, o in CASES])
def test_the_model_is_attention_with_softmax_of_s_log_n_times_the_logits(base, window, options):
    """Past the train length (T = 40, trained at 16), in one chunk and in query chunks of 2 (smaller than the
    window), the float64 model equals the written-out reference; with n taken as i + 1 under a window (the count
    without it) the reference is another function, so the comparison tells the rules apart."""
    T, name = 40, f"{base}+ssmax"
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={name: options} if options else {})
    model = spread(sharpen(DecoderLM(cfg, name, TRAIN, window=window, seed=0))).eval()
    chunked = DecoderLM(cfg, name, TRAIN, window=window, seed=0, max_mask_bytes=4 * T * 2).eval()
    chunked.load_state_dict(model.state_dict())
    idx = tokens(T)
    with torch.no_grad():
        want = reference_forward(model, idx, window, base)
        for m in (model, chunked):
            got = copy.deepcopy(m).double()(idx)  # RoPE's tables stay float32 (within 3e-7 of exact): 1e-6
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert (want - reference_forward(model, idx, window, base, n_of=lambda i, lo: 2 * i + 1)).abs().max() > 1e-3
        if window is not None:
            assert (want - reference_forward(model, idx, window, base, n_of=lambda i, lo: i + 1)).abs().max() > 1e-3
        # and in float32, as trained
        torch.testing.assert_close(model(idx).double(), want, rtol=1e-4, atol=1e-4)
    if window is not None:
        assert len(chunked.encoding.visible_keys(torch.arange(T)).unique()) == window  # n = 1 .. W


@pytest.mark.parametrize("base", ["nope", "rope"])
def test_s_of_one_over_log_n_is_the_base_at_that_n(base):
    """One layer, window W: every query from W - 1 on sees n = W keys, where s = 1 / log W makes the row its
    base; queries 1 .. W - 2 see fewer keys, where it is sharper than its base's softmax would be (query 0, one
    key, is the base's whatever s)."""
    W, T = 6, 30
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    plain = DecoderLM(cfg, base, TRAIN, window=W, seed=0).eval()
    row = DecoderLM(cfg, f"{base}+ssmax", TRAIN, window=W, seed=0).eval()
    sharpen(plain), sharpen(row)
    shared = {k: v for k, v in row.state_dict().items() if not k.startswith("encoding.")}
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in shared.items())  # the same core model
    with torch.no_grad():
        row.encoding.s.fill_(1 / math.log(W))
        a, b = row(tokens(T)), plain(tokens(T))
    torch.testing.assert_close(a[:, W - 1:], b[:, W - 1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a[:, 0], b[:, 0], rtol=1e-5, atol=1e-5)
    assert ((a[:, 1:W - 1] - b[:, 1:W - 1]).abs().amax(-1) > 1e-4).all()


def test_s_is_a_learned_scalar_per_layer_and_head_starting_at_one():
    cfg = ModelConfig(d_model=32, n_layers=3, n_heads=4)
    model = DecoderLM(cfg, "rope+ssmax", TRAIN, seed=0)
    enc = model.encoding
    assert enc.s.shape == (3 * 4,) and torch.equal(enc.s.detach(), torch.ones(12)) and enc.b is None
    assert ssmax.S_INIT == 1.0
    # AdamW's group without weight decay: a vector of scalars, as TabICL's per-head s
    groups = make_optimizer(model, TrainConfig()).param_groups
    assert any(p is enc.s for g in groups if g["weight_decay"] == 0.0 for p in g["params"])
    spread(sharpen(model))
    model(tokens(24)).logsumexp(-1).mean().backward()
    grad = enc.s.grad.view(3, 4)
    assert (grad.abs() > 0).all()
    assert len(set(grad.flatten().tolist())) == 12  # every layer's every head its own
    # a layer's view scales head h's queries by that layer's s_h log n and nothing else
    q, k, pos = torch.randn(1, 4, 10, 8), torch.randn(1, 4, 10, 8), torch.arange(10)
    with torch.no_grad():
        for layer in range(3):
            got_q, got_k = enc.for_layer(layer).rotate(q, k, pos)
            plain_q, plain_k = enc.base.rotate(q, k, pos)
            factor = enc.s[layer * 4:(layer + 1) * 4, None] * torch.log(pos + 1.0)  # (H, T)
            torch.testing.assert_close(got_q, plain_q * factor[None, :, :, None])
            assert torch.equal(got_k, plain_k)
        with pytest.raises(IndexError, match="3 attention layer"):
            enc.for_layer(3)


def test_options_start_s_and_the_bias_and_are_in_the_key():
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2,
                      encoding_options={"nope+ssmax": {"s_init": 0.168, "scale_bias": True}})
    enc = DecoderLM(cfg, "nope+ssmax", TRAIN, seed=0).encoding
    assert torch.allclose(enc.s.detach(), torch.full((4,), 0.168)) and torch.equal(enc.b.detach(), torch.zeros(4))
    cls = encodings.get_class("sinusoidal+ssmax")
    assert cls.key_options(TRAIN, {}) == {"token_scale": 1.0, "pe_scale": 0.02, "s_init": 1.0, "scale_bias": False}
    assert encodings.get_class("rope+ssmax").key_options(TRAIN, {"theta": 500.0, "scale_bias": True}) == {
        "s_init": 1.0, "scale_bias": True}
    for bad, message in (({"s_init": float("nan")}, "s_init must be a finite number"),
                         ({"scale_bias": 1}, "scale_bias must be true or false, got 1"),
                         ({"gamma": 2}, "unknown option.*'gamma'.*valid options: theta, s_init, scale_bias")):
        with pytest.raises(ConfigError, match=message):
            DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2, encoding_options={"rope+ssmax": bad}),
                      "rope+ssmax", TRAIN)


def test_the_base_is_built_as_the_plain_encoding():
    for name in ("learned", "rope"):
        plain = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), name, TRAIN, seed=3)
        row = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), f"{name}+ssmax", TRAIN, seed=3)
        assert plain.encoding.state_dict().keys() == row.encoding.base.state_dict().keys()
        for k, v in plain.encoding.state_dict().items():
            assert torch.equal(v, row.encoding.base.state_dict()[k]), (name, k)
    learned = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), "learned+ssmax", TRAIN).encoding
    with pytest.raises(PositionOutOfRange, match="16 rows"):
        learned.set_eval_length(2 * TRAIN)


def test_a_checkpoint_round_trip_keeps_s_b_and_the_outputs():
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={"rope+ssmax": {"scale_bias": True}})
    model = spread(sharpen(DecoderLM(cfg, "rope+ssmax", TRAIN, window=5, seed=0))).eval()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    assert state["encoding.s"].shape == (8,) and state["encoding.b"].shape == (8,)
    again = DecoderLM(cfg, "rope+ssmax", TRAIN, window=5, seed=1).eval()  # other initial weights
    assert not torch.equal(again.encoding.s, model.encoding.s)
    again.load_state_dict(state)
    assert torch.equal(again.encoding.s, model.encoding.s) and torch.equal(again.encoding.b, model.encoding.b)
    with torch.no_grad():
        assert torch.equal(again(tokens(24)), model(tokens(24)))


def test_the_model_tells_the_encoding_its_window():
    for window in (None, 7):
        enc = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "nope+ssmax", TRAIN, window=window).encoding
        assert enc.window == window
        want = torch.arange(1, 21) if window is None else torch.arange(1, 21).clamp(max=7)
        assert torch.equal(enc.visible_keys(torch.arange(20)), want)
        assert torch.equal(enc.visible_keys(torch.arange(20).expand(3, 20)), want.expand(3, 20))  # (B, T)
    with pytest.raises(ValueError, match="whole number >= 1 or None, got 0"):
        enc.set_window(0)


def test_rows_are_the_plain_q_dot_k_encodings_and_the_rest_are_refused():
    names = [n for n in encodings.available() if n.endswith("+ssmax")]
    assert names == [f"{b}+ssmax" for b in ("sinusoidal", "learned", "rope", "rope-partial", "xpos", "nope")]
    for name in names:
        row = Row.parse(name)
        assert row.cls.trained_as is None and row.cls.family == row.cls.base_cls.family and row.cls.newer
        assert Row.parse(f"{name}+sw64") == Row(name, 64)
    for base, why in (("alibi", "additive bias"), ("t5", "additive bias"), ("cope", "its own logits"),
                      ("rope-yarn", "evaluates the trained 'rope' model"), ("rope+rand", "positions of its own"),
                      ("xpos+bca", "evaluates the trained 'xpos' model")):
        assert why in ssmax.refusal(encodings.get_class(base)), base
        with pytest.raises(UnknownEncodingError, match=f"unknown encoding '{re.escape(base)}\\+ssmax'.*rope\\+ssmax"):
            encodings.get_class(f"{base}+ssmax")
    assert all(ssmax.refusal(encodings.get_class(b)) is None for b in ssmax.BASES)


@pytest.mark.parametrize("spec", ["rope+ssmax+sink4+sw64", "nope+ssmax+sw64+sink4"])
def test_attention_sinks_over_ssmax_are_refused_with_the_reason(spec):
    with pytest.raises(ConfigError, match="attention sinks cannot wrap '(rope|nope)\\+ssmax' \\(SSMax scales a query") as e:
        Row.parse(spec)
    takers = str(e.value).split("take them: ")[1].split(", ")
    assert "rope" in takers and "nope" in takers and not any(t.endswith("+ssmax") for t in takers)
