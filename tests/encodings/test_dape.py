"""DAPE (dape-kerple, dape-alibi): the model's attention against a naive transcription of the authors' formula
(logits -> [logits; tril bias] -> MLP -> residual -> mask -> softmax -> @ v), on chunked eval and training paths,
values and gradients; the authors' initialisation (torch's default Linear, so f is not zero at the start; with
its last layer zeroed DAPE is its base row); one f and one base per layer; gradients; causality; no NaN from
the -inf mask; the checkpoint round trip; bad options and attention sinks refused. The formula tests run on
both paths of f: the C kernels (``dape_kernel``, float32 on the CPU) and the torch ops."""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_bench import encodings, native
from posenc_bench.encodings import dape_kernel
from posenc_bench.errors import ConfigError
from posenc_bench.model.attention import attend
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import DecoderLM, ModelConfig

ROWS = ["dape-kerple", "dape-alibi"]
BASE = {"dape-kerple": "kerple", "dape-alibi": "alibi"}
H, D = 4, 8


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    """f on the C kernels (skipped without a compiler) or on torch ops."""
    if request.param == "kernel" and dape_kernel.library() is None:
        pytest.skip(native.why_not("dape", dape_kernel.SOURCE))
    if request.param == "torch":
        monkeypatch.setattr(dape_kernel, "usable", lambda *tensors: False)
    return request.param


def cfg(n_layers=2, **options):
    return ModelConfig(d_model=H * D, n_layers=n_layers, n_heads=H, encoding_options=options)


def paper_bias(name, block, T):
    """The base bias as the authors build it, (H, T, T) with tril(i - j): 0 for keys after the query.
    KERPLE: -p log(1 + a d) (ParallelKerpleLog_C.forward); ALiBi: -m d with the paper's slopes 2^(-8 h / H)."""
    i = torch.arange(T)
    d = torch.tril(i[:, None] - i[None, :]).double()  # (T, T)
    if name == "dape-kerple":
        p, a = block.base.r1().double(), block.base.r2().double()
        return -p[:, None, None] * torch.log(1 + a[:, None, None] * d)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
    return -slopes[:, None, None] * d


def reference_attention(name, block, q, k, v, window=None):
    """softmax(x + b + mlp2(cat(x, b))) @ v with x = q k^T / sqrt(D), the mask filled in after the MLP (GPT-NeoX's
    masked_fill with the dtype's lowest value), in float64, written out from the authors' AliBi_C /
    ParallelKerpleLog_C and ParallelSelfAttention.attention. q, k, v (B, H, T, D)."""
    q, k, v = q.double(), k.double(), v.double()
    B, _, T, _ = q.shape
    x = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, T, T)
    b = paper_bias(name, block, T)[None].expand(B, -1, -1, -1)  # (B, H, T, T)
    cat = torch.cat((x, b), dim=1).permute(0, 2, 3, 1)  # (B, T, T, 2H)
    w1, b1 = block.mlp.fc.weight.double(), block.mlp.fc.bias.double()
    w2, b2 = block.mlp.proj.weight.double(), block.mlp.proj.bias.double()
    f = F.leaky_relu(cat @ w1.T + b1, 0.01) @ w2.T + b2  # (B, T, T, H)
    scores = x + b + f.permute(0, 3, 1, 2)
    i = torch.arange(T)
    hidden = i[None, :] > i[:, None]
    if window is not None:
        hidden |= i[None, :] <= i[:, None] - window
    scores = scores.masked_fill(hidden, torch.finfo(torch.float64).min)
    return torch.softmax(scores, dim=-1) @ v


def capture(model, layer):
    """Hooks on attention layer ``layer``: its q, k, v (B, H, T, D) and the attention output (B, H, T, D)."""
    seen = {}
    attn = model.blocks[layer].attn

    def qkv(_, __, out):
        B, T, C = out.shape[0], out.shape[1], out.shape[2] // 3
        seen["qkv"] = [t.view(B, T, H, D).transpose(1, 2) for t in out.split(C, dim=2)]  # (B, T, C) -> (B, H, T, D)

    def proj(_, args):
        B, T, C = args[0].shape
        seen["y"] = args[0].view(B, T, H, D).transpose(1, 2)  # (B, T, C) -> (B, H, T, D)

    return seen, [attn.qkv.register_forward_hook(qkv), attn.proj.register_forward_pre_hook(proj)]


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("window", [None, 5])
def test_the_models_chunked_eval_attention_is_the_authors_formula(name, window, path):
    """Every layer's attention output, with chunks of 3 queries (and f over one row at a time), past the train
    length, equals the naive formula with that layer's own base and f."""
    torch.manual_seed(0)
    B, T = 2, 24
    max_mask_bytes = 3 * 4 * H * B * AttentionPlan.LOGIT_TENSORS * T  # 3 queries a chunk
    model = DecoderLM(cfg(), name, 8, window=window, seed=0, max_mask_bytes=max_mask_bytes).eval()
    with torch.no_grad():
        assert len(AttentionPlan(model.encoding, torch.arange(T), window, max_mask_bytes, batch=B).chunks) == 8
        for p in model.encoding.parameters():  # trained-looking weights: f far from its init
            p.add_(torch.randn_like(p) * 0.3)
        x = torch.randint(0, 256, (B, T))
        for layer in range(2):
            seen, hooks = capture(model, layer)
            model(x)
            for h in hooks:
                h.remove()
            want = reference_attention(name, model.encoding.layers[layer], *seen["qkv"], window=window)
            assert torch.allclose(seen["y"].double(), want, atol=2e-5), (layer, (seen["y"].double() - want).abs().max())


@pytest.mark.parametrize("name", ROWS)
def test_training_attention_and_its_gradients_are_the_authors_formula(name, path):
    """In training (two query chunks of 128 at 136 tokens) the layer's output and the gradients of q, k, v, f
    and the base's parameters equal autograd through the naive formula."""
    torch.manual_seed(1)
    T = 136
    enc = encodings.build(name, d_model=H * D, n_heads=H, train_len=T, n_layers=2)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    q, k, v = (torch.randn(1, H, T, D, requires_grad=True) for _ in range(3))
    w = torch.randn(1, H, T, D)
    plan = AttentionPlan(enc, torch.arange(T), None, 8 << 20)
    assert plan.path == "logits" and len(plan.chunks) == 2
    layer = enc.for_layer(1)
    got = attend(layer, plan, q, k, v, 1 / math.sqrt(D))
    params = list(enc.layers[1].parameters())
    grads = torch.autograd.grad((got * w).sum(), [q, k, v, *params])
    want = reference_attention(name, enc.layers[1], q, k, v)
    want_grads = torch.autograd.grad((want * w.double()).sum(), [q, k, v, *params])
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert len(params) == (6 if name == "dape-kerple" else 4)  # r1, r2 (KERPLE), fc and proj weights and biases
    for g, r in zip(grads, want_grads):
        assert torch.isfinite(g).all() and torch.allclose(g.double(), r.double(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ROWS)
def test_the_authors_init_torchs_default_linear_so_f_is_not_zero_at_the_start(name):
    """mlp2 is built with nn.Linear's default init (U(+-1/sqrt(fan_in)) for weights and biases), width 32, one per
    layer, each drawn anew: DAPE differs from its base from the first step."""
    model = DecoderLM(cfg(n_layers=3), name, 16, seed=0)
    blocks = model.encoding.layers
    assert len(blocks) == 3 and model.encoding.mlp_width == 32
    for block in blocks:
        fc, proj = block.mlp.fc, block.mlp.proj
        assert fc.weight.shape == (32, 2 * H) and proj.weight.shape == (H, 32)
        for layer, fan_in in ((fc, 2 * H), (proj, 32)):
            bound = 1 / math.sqrt(fan_in)
            assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound
            assert layer.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.25)  # uniform's std
    assert not torch.equal(blocks[0].mlp.fc.weight, blocks[1].mlp.fc.weight)
    base = DecoderLM(cfg(n_layers=3), BASE[name], 16, seed=0).eval()
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert not torch.allclose(model.eval()(x), base(x), atol=1e-3)


@pytest.mark.parametrize("name", ROWS)
def test_with_fs_last_layer_zeroed_dape_is_its_base_row(name):
    """x + B + f([x; B]) with f's output layer at zero is x + B: the base row's model exactly (KERPLE's per-layer
    r1, r2 set to the kerple row's shared ones), on chunked eval."""
    model = DecoderLM(cfg(), name, 16, seed=0, max_mask_bytes=4096).eval()
    base = DecoderLM(cfg(), BASE[name], 16, seed=0).eval()
    with torch.no_grad():
        for block in model.encoding.layers:
            block.mlp.proj.weight.zero_(), block.mlp.proj.bias.zero_()
            if name == "dape-kerple":
                block.base.load_state_dict(base.encoding.state_dict())
        x = torch.randint(0, 256, (2, 40))
        assert torch.allclose(model(x), base(x), atol=1e-5)


@pytest.mark.parametrize("name", ROWS)
def test_each_layer_attends_with_its_own_f(name):
    model = DecoderLM(cfg(), name, 16, seed=0).eval()
    x = torch.randint(0, 256, (1, 20))
    outs = []
    for perturb in (False, True):
        seen0, hooks0 = capture(model, 0)
        with torch.no_grad():
            if perturb:
                model.encoding.layers[1].mlp.proj.bias.add_(1.0)
                model.encoding.layers[1].mlp.proj.weight.add_(0.5)
            model(x)
        outs.append(seen0["y"].clone())
        seen0.clear()
        for h in hooks0:
            h.remove()
    assert torch.equal(outs[0], outs[1])  # layer 0 does not read layer 1's f
    with pytest.raises(IndexError, match="layer 2 has none.*0 .. 1"):
        model.encoding.for_layer(2)


@pytest.mark.parametrize("name", ROWS)
def test_gradients_reach_every_f_and_the_bases_parameters_in_training(name):
    model = DecoderLM(cfg(), name, 16, seed=0).train()
    x = torch.randint(0, 256, (2, 17))
    F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
    names = dict(model.encoding.named_parameters())
    for layer in range(2):
        want = ["mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]
        want += ["base.raw_r1", "base.raw_r2"] if name == "dape-kerple" else []
        for p in want:
            grad = names[f"layers.{layer}.{p}"].grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, (layer, p)
    assert len(names) == 2 * len(want)


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("train", [False, True])
def test_a_future_token_never_changes_an_earlier_output(name, train):
    """Causal on the chunked eval path (chunks of a few queries) and the training path, with a window too."""
    for window in (None, 6):
        model = DecoderLM(cfg(), name, 16, window=window, seed=0, max_mask_bytes=4096).train(train)
        x = torch.randint(0, 256, (2, 30))
        y = x.clone()
        y[:, 17:] = torch.randint(0, 256, (2, 13))
        with torch.set_grad_enabled(train):
            a, b = model(x), model(y)
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        assert torch.allclose(a[:, :17], b[:, :17], atol=1e-6) and not torch.allclose(a[:, 17:], b[:, 17:])


@pytest.mark.parametrize("name", ROWS)
def test_the_mask_is_added_after_f_so_no_nan_even_with_large_logits(name):
    """The chunk's mask is -inf on hidden pairs: f never reads it, so logits stay finite where visible and
    exactly -inf where hidden, at any scale of q . k."""
    enc = encodings.build(name, d_model=H * D, n_heads=H, train_len=8)
    T = 10
    q, k = torch.randn(2, H, T, D) * 100, torch.randn(2, H, T, D) * 100
    mask = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))[None, None]
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out = enc.attention_logits(q, k, torch.arange(T), torch.arange(T), mask, 1 / math.sqrt(D))
        hidden = torch.isinf(mask).expand_as(out)
        assert not out.isnan().any() and torch.isfinite(out[~hidden]).all() and (out[hidden] == float("-inf")).all()


@pytest.mark.parametrize("name", ROWS)
def test_checkpoint_round_trip_gives_the_same_logits(name, tmp_path):
    """Every layer's f and base (and a non-default width) saved and loaded into a model of another seed."""
    from posenc_bench.bench import checkpoint

    c = cfg(n_layers=3, **{name: {"mlp_width": 8}})
    model = DecoderLM(c, name, 16, seed=0)
    assert model.encoding.layers[2].mlp.fc.weight.shape == (8, 2 * H)
    with torch.no_grad():
        for p in model.encoding.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    meta = {"cell_key": "k", "config": {}, "encoding": name, "window": None, "seed": 0, "outcome": {"status": "ok"}}
    checkpoint.save(tmp_path, model, meta)
    fresh = checkpoint.read(tmp_path).load_into(DecoderLM(c, name, 16, seed=7))
    x = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        assert torch.equal(model.eval()(x), fresh.eval()(x))
    for (key, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), key


def test_bad_options_and_attention_sinks_are_refused_naming_the_value():
    for width in (0, -3):
        with pytest.raises(ConfigError, match=rf"mlp_width must be an integer >= 1 \(the authors': 32\), got {width}"):
            DecoderLM(cfg(**{"dape-kerple": {"mlp_width": width}}), "dape-kerple", 16)
    with pytest.raises(ConfigError, match="unknown option.*'width'.*valid options: mlp_width"):
        encodings.build("dape-alibi", d_model=H * D, n_heads=H, train_len=8, options={"width": 4})
    with pytest.raises(ConfigError, match=r"cannot wrap 'dape-alibi' \(on the explicit-logits path its base bias") as e:
        DecoderLM(cfg(), "dape-alibi+sink4+sw8", 16)
    takers = str(e.value).split("take them: ")[1].split(", ")
    assert "alibi" in takers and not any(t.startswith("dape") for t in takers)


def test_rows_are_registered_in_the_relative_bias_family_with_the_paper():
    for name in ROWS:
        cls = encodings.get_class(name)
        assert encodings.family(cls) == "relative bias" and cls.newer and cls.trained_as is None
        assert cls.paper == "Zheng et al., NeurIPS 2024 (arXiv:2405.14722)" and cls.has_attention_logits
    assert [n for n in encodings.available() if n.startswith("dape")] == ROWS
