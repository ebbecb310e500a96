"""CoPE: gates, counted positions and interpolated position logits against the paper's definition, built pair
by pair; chunked attention equals one chunk; one position table per layer (the authors' default) or one shared
(their --cope-shared), each layer attending with its own, trained, saved and loaded; the hand-written backward
(``CoPEAttention``) equals autograd through the definition, alone and through the model, for every parameter."""

import io
import math

import pytest
import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.cope import CoPE, cope_attention, cope_logits
from posenc_bench.model.plan import AttentionPlan
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


def causal_mask(T):
    return torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))[None, None]


def cope(n_layers=1, **options):
    return CoPE(d_model=16, n_heads=2, train_len=8, n_layers=n_layers, **options)


@pytest.mark.parametrize("npos", [0, 4])
@pytest.mark.parametrize("shared", [False, True])
def test_logits_equal_the_pair_by_pair_definition(npos, shared):
    torch.manual_seed(0)
    T, D = 9, 8
    enc = encodings.build("cope", d_model=2 * D, n_heads=2, train_len=8, options={"npos_max": npos, "shared": shared})
    assert enc.npos_max == (npos or 9)  # default: train length + 1, as the authors' code
    with torch.no_grad():
        enc.pos_emb.normal_()
    q, k = torch.randn(1, 2, T, D, dtype=torch.float64) * 2, torch.randn(1, 2, T, D, dtype=torch.float64) * 2
    got = enc.attention_logits(q, k, torch.arange(T), torch.arange(T), causal_mask(T), 1 / math.sqrt(D))
    for h in range(2):
        want = reference_logits(q[0, h], k[0, h], enc.table(0).double(), enc.npos_max)
        assert torch.allclose(got[0, h].double(), want, atol=1e-4), h


def test_per_layer_tables_by_default_and_one_shared_table_as_an_option():
    per_layer, shared = cope(n_layers=3), cope(n_layers=3, shared=True)
    assert not per_layer.shared and per_layer.pos_emb.shape == (3, 8, 9)
    assert shared.pos_emb.shape == (8, 9)  # the layout CoPE had before: its checkpoints load here
    assert CoPE.key_options(8, {}) == {"shared": False} and CoPE.key_options(8, {"shared": True}) == {"shared": True}
    with torch.no_grad():
        shared.pos_emb.normal_()
    assert all(shared.table(i) is shared.pos_emb for i in range(3))
    with pytest.raises(IndexError, match="n_layers"):
        per_layer.for_layer(3)
    with pytest.raises(ValueError, match="shared"):
        cope(shared="yes")
    with pytest.raises(ValueError, match="n_layers"):
        cope(n_layers=0)


def test_each_layer_view_attends_with_its_own_table_entry_by_entry():
    torch.manual_seed(1)
    T, D, L = 7, 8, 3
    enc = cope(n_layers=L)
    with torch.no_grad():
        enc.pos_emb.normal_()
    q, k = torch.randn(1, 2, T, D, dtype=torch.float64) * 2, torch.randn(1, 2, T, D, dtype=torch.float64) * 2
    pos = torch.arange(T)
    outs = []
    for layer in range(L):
        view = enc.for_layer(layer)
        assert view.has_attention_logits and not view.has_attention_parts and view.n_heads == 2
        assert AttentionPlan(view, pos, None, 1 << 20).path == "logits"  # the plan reads the view's flags
        got = view.attention_logits(q, k, pos, pos, causal_mask(T), 1 / math.sqrt(D))
        for h in range(2):
            want = reference_logits(q[0, h], k[0, h], enc.pos_emb[layer].double(), enc.npos_max)
            assert torch.allclose(got[0, h].double(), want, atol=1e-4), (layer, h)
        outs.append(got)
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])


def train_step(model, x):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("shared", [False, True])
def test_a_model_trains_its_tables_and_reloads_them(shared):
    cfg = ModelConfig(d_model=32, n_layers=3, n_heads=4, encoding_options={"cope": {"shared": shared}})
    model = DecoderLM(cfg, "cope", 16, seed=0)
    tables = model.encoding.pos_emb
    assert tables.shape == ((8, 17) if shared else (3, 8, 17))  # one per layer unless shared
    x = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    train_step(model, x)
    assert tables.abs().sum() > 0  # trained from zero
    if not shared:  # each layer's table has its own gradient
        assert not torch.allclose(tables[0], tables[1]) and not torch.allclose(tables[1], tables[2])
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    again = DecoderLM(cfg, "cope", 16, seed=5)
    again.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        assert torch.equal(model.eval()(x), again.eval()(x))
    other = DecoderLM(ModelConfig(d_model=32, n_layers=3, n_heads=4,
                                  encoding_options={"cope": {"shared": not shared}}), "cope", 16)
    with pytest.raises(RuntimeError, match="pos_emb"):  # a checkpoint of the other layout does not load
        other.load_state_dict(model.state_dict())


def test_the_model_uses_layer_i_table_in_layer_i():
    """Swapping two layers' tables changes the output; giving every layer the same table equals shared."""
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, "cope", 16, seed=0).eval()
    shared = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={"cope": {"shared": True}}),
                       "cope", 16, seed=0).eval()
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    e = torch.randn(2, 8, 17, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.encoding.pos_emb.copy_(e)
        before = model(x)
        model.encoding.pos_emb.copy_(e.flip(0))
        assert not torch.allclose(before, model(x), atol=1e-4)
        model.encoding.pos_emb.copy_(e[:1].expand(2, -1, -1))
        shared.encoding.pos_emb.copy_(e[0])
        assert torch.allclose(model(x), shared(x), atol=1e-6)


def test_chunked_attention_equals_one_chunk_and_window_masks_the_count():
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    whole = DecoderLM(cfg, "cope", 16, seed=0).eval()
    chunked = DecoderLM(cfg, "cope", 16, seed=0, max_mask_bytes=1 << 12).eval()
    x = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        for m in (whole, chunked):
            m.encoding.pos_emb.normal_(generator=torch.Generator().manual_seed(1))
        assert torch.allclose(whole(x), chunked(x), atol=1e-5)
    with torch.no_grad():
        assert len(AttentionPlan(chunked.encoding, torch.arange(64), None, 1 << 12, batch=2).chunks) > 1


def chunk_mask(Q, K, window=None):
    """The mask of the last Q queries of K keys (0 visible, -inf not): causal, and within ``window`` keys."""
    rel = torch.arange(K)[None] - torch.arange(K - Q, K)[:, None]  # (Q, K): key minus query index
    allowed = (rel <= 0) & (rel > -window) if window else rel <= 0
    return torch.zeros(1, 1, Q, K).masked_fill(~allowed, float("-inf"))


def by_autograd(table, q, k, v, mask, scale):
    """Today's path: softmax of the definition's logits, @ v, differentiated by autograd."""
    return torch.softmax(cope_logits(table, q, k, mask, scale).float(), dim=-1) @ v


def by_torch_ops(table, q, k, v, mask, scale):
    """CoPEAttention with its element-wise work in torch ops (where no C kernel is built, and off the CPU)."""
    return cope_attention(table, q, k, v, mask, scale, native=False)


def both_ways(table, q, k, v, mask, scale, dout) -> list[tuple[torch.Tensor, ...]]:
    """(out, d table, dq, dk, dv) by autograd through the definition and by CoPEAttention, asserted equal
    (1e-5); CoPEAttention both in torch ops and in the C kernels (``cope_kernel``, float32 on the CPU)."""
    results = []
    for attention in (by_autograd, cope_attention, by_torch_ops):
        inputs = [x.clone().requires_grad_() for x in (table, q, k, v)]
        out = attention(*inputs, mask, scale)
        results.append((out, *torch.autograd.grad(out, inputs, dout)))
    for got in results[1:]:
        for name, want, value in zip(("out", "table", "q", "k", "v"), results[0], got):
            torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-5, msg=name)
    return results


@pytest.mark.parametrize("Q,K,npos,window,clamped", [
    (6, 6, 9, None, False),  # one square chunk, a table longer than any count (unread columns get 0)
    (5, 13, 40, None, False),  # a later chunk: keys before its queries
    (7, 12, 30, 4, False),  # a sliding window: the counts stop at its edge
    (6, 16, 4, None, True),  # npos_max 4: counts past 3 are clamped there (no gradient through p)
])
def test_the_hand_written_backward_equals_autograd_through_the_definition(Q, K, npos, window, clamped):
    g = torch.Generator().manual_seed(Q * K)
    B, H, D = 2, 3, 8
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (Q, K, K))
    table = torch.randn(D, npos, generator=g)
    mask, scale, dout = chunk_mask(Q, K, window), D ** -0.5, torch.randn(B, H, Q, D, generator=g)
    counts = torch.sigmoid(q @ k.transpose(-1, -2) * scale).mul(torch.isfinite(mask)).sum(-1)  # p of key 0
    assert bool((counts > npos - 1).any()) == clamped
    results = both_ways(table, q, k, v, mask, scale, dout)
    assert results[1][1].abs().sum() > 0
    if K + 1 < npos:  # counts never reach the last columns: no gradient there, on either path
        assert not results[1][1][:, K + 1:].any() and not results[0][1][:, K + 1:].any()
    with torch.no_grad():  # evaluation: the same forward, nothing saved
        torch.testing.assert_close(cope_attention(table, q, k, v, mask, scale), results[0][0], rtol=0, atol=1e-6)


def test_counts_that_stay_short_of_the_keys_read_and_train_only_the_columns_they_reach():
    # gates near 0 but for every 8th key: a row of 64 keys counts to about 8, so the forward reads ~10 columns
    # of a 65-column table (on the CPU it computes only those); values and gradients equal the definition's
    g = torch.Generator().manual_seed(7)
    B, H, D, Q, K, npos = 2, 2, 8, 8, 64, 65
    q, k, v = (torch.randn(B, H, n, D, generator=g) * 0.1 for n in (Q, K, K))
    q[..., 0], k[..., 0] = 6.0, -6.0
    k[:, :, ::8, 0] = 6.0  # open gates
    table = torch.randn(D, npos, generator=g)
    mask, scale, dout = chunk_mask(Q, K), D ** -0.5, torch.randn(B, H, Q, D, generator=g)
    counts = torch.sigmoid(q @ k.transpose(-1, -2) * scale).mul(torch.isfinite(mask)).sum(-1)
    assert 6 < counts.max() < 12
    results = both_ways(table, q, k, v, mask, scale, dout)
    reached = int(counts.max()) + 2
    assert results[1][1][:, :reached].abs().sum() > 0 and not results[1][1][:, reached:].any()


def gradients(model, x):
    loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    names, params = zip(*model.named_parameters())
    return dict(zip(names, torch.autograd.grad(loss, params)))


@pytest.mark.parametrize("shared,window", [(False, None), (True, None), (False, 10)])
def test_every_gradient_of_a_chunked_model_equals_autograd_through_the_definition(monkeypatch, shared, window):
    """The model's chunks (several query chunks, keys from before them; a sliding window; per-layer or one
    shared table, trained away from zero) through CoPEAttention and through today's autograd path."""
    monkeypatch.setattr(AttentionPlan, "TRAIN_LOGIT_ROWS", 16)  # training chunks: 16 queries
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={"cope": {"shared": shared}})
    models = [DecoderLM(cfg, "cope", 16, seed=0, window=window, max_mask_bytes=1 << 13) for _ in range(2)]
    models[0].encoding.has_attention_output = False  # the reference: softmax(attention_logits) @ v by autograd
    assert CoPE.has_attention_output and models[1].encoding.for_layer(1).has_attention_output
    x = torch.randint(0, 256, (2, 41), generator=torch.Generator().manual_seed(4))
    assert len(AttentionPlan(models[1].encoding, torch.arange(40), window, 1 << 13, batch=2).chunks) > 2  # training
    for m in models:
        with torch.no_grad():
            m.encoding.pos_emb.normal_(generator=torch.Generator().manual_seed(1))
    want, got = gradients(models[0], x), gradients(models[1], x)
    assert want.keys() == got.keys() and "encoding.pos_emb" in got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)
    with torch.no_grad():  # evaluation numbers as before
        torch.testing.assert_close(models[1].eval()(x), models[0].eval()(x), rtol=0, atol=1e-6)


def test_the_base_has_no_attention_output_of_its_own():
    enc = Encoding(d_model=8, n_heads=2, train_len=16)
    assert not Encoding.has_attention_output
    with pytest.raises(NotImplementedError):
        enc.attention_output(*(torch.zeros(1, 2, 3, 4) for _ in range(3)), torch.arange(3), torch.arange(3),
                             torch.zeros(1, 1, 3, 3), 0.5)

