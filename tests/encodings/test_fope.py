"""FoPE (Hua et al. 2025): each pair's rotation a Fourier series of the kept frequencies, the frequencies with a
period past the train length clipped to zero frequency, checked against a loop over the authors' formula
(TsinghuaC3I/Fourier-Position-Embedding, olmo/model.py, ``FourierEmbedding``)."""

import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.errors import ConfigError
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def authors_frequencies(D, L, theta=10000.0):
    """``get_inv_freq`` with the FoPE configs' floor clamp: float32 theta^(-2i/D), those below 2 pi / L set to
    0 and dropped (``fourier_ignore_zero``)."""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float) / D))
    inv[inv < 2 * torch.pi / L] = 0.0
    return inv[inv != 0.0]


def reference_rotation(x, pos, omega, cos_coef, sin_coef):
    """The authors' rotation, one entry at a time in float64: x (H, T, D), positions (T,), omega (M,),
    coefficients (H, M, O). C_d(t) = sum_f cos_coef[f, d] cos(t omega_f) for d < O, else 1 (the padding);
    S_d likewise with sin; pair d: (x_d C_d - x_{d+D/2} S_d, x_{d+D/2} C_d + x_d S_d)."""
    H, T, D = x.shape
    M, O = cos_coef.shape[1:]
    out = torch.empty(H, T, D, dtype=torch.float64)
    for h in range(H):
        for t in range(T):
            p = float(pos[t])
            for d in range(D // 2):
                c = sum(float(cos_coef[h, f, d]) * math.cos(p * float(omega[f])) for f in range(M)) if d < O else 1.0
                s = sum(float(sin_coef[h, f, d]) * math.sin(p * float(omega[f])) for f in range(M)) if d < O else 1.0
                x1, x2 = float(x[h, t, d]), float(x[h, t, d + D // 2])
                out[h, t, d], out[h, t, d + D // 2] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


@pytest.mark.parametrize("D,L,kept,width", [(64, 512, 16, 16), (64, 1024, 18, 16), (32, 128, 6, 6), (8, 16, 1, 1)])
def test_kept_frequencies_complete_a_turn_within_the_train_length(D, L, kept, width):
    enc = encodings.build("fope", d_model=2 * D, n_heads=2, train_len=L)
    assert torch.equal(enc.inv_freq, authors_frequencies(D, L)) and enc.inv_freq.numel() == kept
    assert enc.width == width == min(kept, D // 4)
    every = [10000 ** (-2 * i / D) for i in range(D // 2)]
    assert all(2 * math.pi / w <= L for w in enc.inv_freq.tolist())  # period within the train window
    assert all(2 * math.pi / w > L for w in every[kept:])  # the clipped ones: a period past it
    assert enc.sin_coef.shape == enc.cos_coef.shape == (1, 2, kept, width)


def test_coefficients_are_the_authors_eye_xavier_norm():
    """gain 0: exactly the identity (M = O) or the step identity (M > O: 1 at (i s, i), s = ceil(M / O)); the
    default gain 0.3: independent N(0, 0.3^2 2 / (M O + H O)) noise around it, per layer, sine and cosine."""
    eye = encodings.build("fope", d_model=512, n_heads=8, train_len=512, options={"gain": 0.0})
    assert torch.equal(eye.sin_coef[0], torch.eye(16).expand(8, 16, 16)) and torch.equal(eye.cos_coef, eye.sin_coef)
    step = encodings.build("fope", d_model=512, n_heads=8, train_len=1024, options={"gain": 0.0})
    want = torch.zeros(18, 16)
    for i in range(16):  # step ceil(18 / 16) = 2: rows 0, 2, .., 16 for columns 0 .. 8, none past row 17
        if 2 * i < 18:
            want[2 * i, i] = 1.0
    assert torch.equal(step.cos_coef[0, 3], want) and int(want.sum()) == 9
    torch.manual_seed(0)
    enc = encodings.build("fope", d_model=512, n_heads=8, train_len=1024, n_layers=3)
    assert enc.gain == 0.3 and enc.cos_coef.shape == (3, 8, 18, 16)
    noise = torch.cat([enc.sin_coef - want, enc.cos_coef - want]).flatten()  # 6 x 2304 draws
    assert noise.std().item() == pytest.approx(0.3 * math.sqrt(2 / (18 * 16 + 8 * 16)), rel=0.05)
    assert abs(noise.mean().item()) < 3e-3
    assert not torch.equal(enc.sin_coef[0], enc.cos_coef[0]) and not torch.equal(enc.sin_coef[0], enc.sin_coef[1])
    assert dict(enc.named_parameters()) == {}  # the authors' fourier_learnable=False: buffers, never trained


@pytest.mark.parametrize("L,kept,width", [(48, 2, 2), (700, 5, 4)])  # M = O, and M > O (step identity)
@pytest.mark.parametrize("pos", [torch.arange(40), torch.arange(7, 47), torch.tensor([5, 0, 300, 17, 2, 1000])])
def test_rotation_equals_the_authors_formula_entry_by_entry(pos, L, kept, width):
    torch.manual_seed(1)
    D, H = 16, 2
    enc = encodings.build("fope", d_model=D * H, n_heads=H, train_len=L, n_layers=2)
    assert (enc.inv_freq.numel(), enc.width) == (kept, width)
    q, k = torch.randn(2, H, len(pos), D), torch.randn(2, H, len(pos), D)
    omega = authors_frequencies(D, L)
    for layer in range(2):
        qr, kr = enc.for_layer(layer).rotate(q, k, pos)
        for b in range(2):
            want_q = reference_rotation(q[b], pos, omega, enc.cos_coef[layer], enc.sin_coef[layer])
            want_k = reference_rotation(k[b], pos, omega, enc.cos_coef[layer], enc.sin_coef[layer])
            assert torch.allclose(qr[b].double(), want_q, atol=2e-5)
            assert torch.allclose(kr[b].double(), want_k, atol=2e-5)
    assert not torch.allclose(enc.for_layer(0).rotate(q, k, pos)[0], enc.for_layer(1).rotate(q, k, pos)[0])
    assert torch.equal(enc.rotate(q, k, pos)[0], enc.for_layer(0).rotate(q, k, pos)[0])


def test_clipped_pairs_are_exactly_zero_frequency():
    """The D/2 - O pairs past the series take cos = sin = 1 (the authors' padding) at every position: the same
    output wherever the token sits, bitwise, while the series pairs change with position."""
    enc = encodings.build("fope", d_model=64, n_heads=2, train_len=128)  # D 32: 6 kept frequencies, O = 6
    x = torch.randn(1, 2, 1, 32).expand(1, 2, 300, 32).contiguous()
    xr, _ = enc.rotate(x, x, torch.arange(300))
    O, half = enc.width, 16
    for d in range(O, half):
        for col, want in ((d, x[..., d] - x[..., d + half]), (d + half, x[..., d + half] + x[..., d])):
            assert torch.equal(xr[..., col], xr[..., :1, col].expand_as(xr[..., col]))
            assert torch.allclose(xr[..., col], want, atol=1e-6)
    for d in range(O):
        assert (xr[..., d] - xr[..., :1, d]).abs().max() > 0.1


def logits(enc, q, k, T):
    """q . k of one q vector at every position i and one k vector at every j: (H, T, T)."""
    qs, ks = (v.expand(1, -1, T, -1).contiguous() for v in (q, k))
    qr, kr = enc.rotate(qs, ks, torch.arange(T))
    return (qr @ kr.transpose(-1, -2))[0]


def test_logit_depends_on_i_minus_j_with_identity_coefficients_only():
    """gain 0 (the "eye" init): q_i . k_j is a function of i - j. The default init perturbs the sine and cosine
    bases independently, so the logit also moves with i + j (not shift-invariant, by the authors' design)."""
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, 1, 32), torch.randn(1, 2, 1, 32)
    for gain, invariant in ((0.0, True), (0.3, False)):
        s = logits(encodings.build("fope", d_model=64, n_heads=2, train_len=128, options={"gain": gain}), q, k, 200)
        spread = max((torch.diagonal(s, offset=-delta, dim1=-2, dim2=-1).std(-1).max().item())
                     for delta in (0, 3, 17, 150))
        assert (spread < 1e-4) if invariant else (spread > 1e-2), (gain, spread)


def test_reduces_to_rope_with_identity_coefficients():
    """gain 0: the series pairs are RoPE's first M pairs exactly; the clipped pairs add 2 q . k of their
    entries whatever the distance (cos = sin = 1 on q and k alike)."""
    torch.manual_seed(3)
    fope = encodings.build("fope", d_model=128, n_heads=2, train_len=512, options={"gain": 0.0})  # D 64: M = O = 16
    rope = encodings.build("rope", d_model=128, n_heads=2, train_len=512)
    q, k = torch.randn(2, 2, 100, 64), torch.randn(2, 2, 100, 64)
    pos = torch.arange(100)
    (fq, fk), (rq, rk) = fope.rotate(q, k, pos), rope.rotate(q, k, pos)
    series = [*range(16), *range(32, 48)]
    clipped = [*range(16, 32), *range(48, 64)]
    assert torch.allclose(fq[..., series], rq[..., series], atol=1e-6)
    assert torch.allclose(fk[..., series], rk[..., series], atol=1e-6)
    want = rq[..., series] @ rk[..., series].transpose(-1, -2) + 2 * q[..., clipped] @ k[..., clipped].transpose(-1, -2)
    assert torch.allclose(fq @ fk.transpose(-1, -2), want, atol=1e-4)


def test_gradient_is_the_textbook_formulas_for_non_unit_series():
    enc = encodings.build("fope", d_model=32, n_heads=2, train_len=64)
    c, s = enc.tables(torch.arange(30), 0, torch.float64)  # (H, T, D/2), not unit: c^2 + s^2 != 1
    assert ((c ** 2 + s ** 2 - 1).abs() > 1e-3).any()
    x = torch.randn(2, 2, 30, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 2, 30, 16, dtype=torch.float64)
    ours, _ = enc.rotate(x, x, torch.arange(30))
    x1, x2 = x.chunk(2, -1)
    ref = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    assert torch.allclose(ours, ref, atol=1e-6)
    (got,), (want,) = torch.autograd.grad(ours, x, g), torch.autograd.grad(ref, x, g)
    assert torch.allclose(got, want, atol=1e-6)


def test_series_is_summed_in_float32_under_autocast():
    enc = encodings.build("fope", d_model=64, n_heads=2, train_len=128)
    plain = enc.tables(torch.arange(64), 0, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = enc.tables(torch.arange(64), 0, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(plain, under))


def test_each_layer_has_its_coefficients_and_a_checkpoint_keeps_them(tmp_path):
    from posenc_bench.bench import checkpoint

    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=2)
    model = DecoderLM(cfg, "fope", 64, seed=0)
    assert model.encoding.cos_coef.shape == (2, 2, 5, 5)  # D 32 at train length 64: 5 kept frequencies
    assert {"encoding.sin_coef", "encoding.cos_coef"} <= set(model.state_dict())
    with pytest.raises(IndexError, match="layer 2 has none"):
        model.encoding.for_layer(2)
    meta = {"cell_key": "k", "config": {}, "encoding": "fope", "window": None, "seed": 0, "outcome": {"status": "ok"}}
    checkpoint.save(tmp_path, model, meta)
    other = DecoderLM(cfg, "fope", 64, seed=7)
    assert not torch.equal(other.encoding.sin_coef, model.encoding.sin_coef)  # another seed draws others
    x = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        before = other.eval()(x)  # a forward before loading: nothing derived from the old draw may stay
        fresh = checkpoint.read(tmp_path).load_into(other)
        assert torch.equal(fresh.encoding.sin_coef, model.encoding.sin_coef)
        assert torch.equal(fresh.encoding.cos_coef, model.encoding.cos_coef)
        assert torch.equal(fresh(x), model.eval()(x)) and not torch.equal(before, fresh(x))


def test_bad_options_are_refused_naming_the_value():
    with pytest.raises(ConfigError, match="gain must be >= 0.*-0.1"):
        DecoderLM(ModelConfig(d_model=32, n_heads=2, n_layers=1, encoding_options={"fope": {"gain": -0.1}}), "fope", 8)
    with pytest.raises(ConfigError, match="even head dimension.*9"):
        DecoderLM(ModelConfig(d_model=36, n_heads=4, n_layers=1), "fope", 8)
