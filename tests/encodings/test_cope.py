"""CoPE: gates, counted positions and interpolated position logits against the paper's definition, built pair
by pair; chunked attention equals one chunk; one position table per layer (the authors' default) or one shared
(their --cope-shared), each layer attending with its own, trained, saved and loaded."""

import io
import math

import pytest
import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.encodings.cope import CoPE
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
    assert len(AttentionPlan(chunked.encoding, torch.arange(64), None, 1 << 12, batch=2).chunks) > 1
