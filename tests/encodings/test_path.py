"""PaTH (encodings/path.py) against its definition, written out pair by pair: query i weighs key j <= i by
softmax_j(q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d)), H_t = I - beta_t w_t w_t^T, with w_t = l2norm(silu(causal
conv_3(W_up W_down x))) and beta_t = 2 sigmoid(b . x_t + c) from the layer's normalised input x (Yang et al. 2025;
the authors' ``PaTHAttention`` and ``naive_path_attn`` in fla-org/flash-linear-attention)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from posenc_bench.encodings import build
from posenc_bench.encodings.path import householder_logits
from posenc_bench.model.transformer import DecoderLM, ModelConfig

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4)


def reference_householder(enc, h, layer):
    """w (B, T, H, D) and beta (B, T, H) of hidden states h (B, T, C), the conv summed tap by tap."""
    B, T, C = h.shape
    H = enc.n_heads
    low = h @ enc.w_down[layer].T @ enc.w_up[layer].T  # (B, T, C)
    conv = torch.zeros_like(low)
    for t in range(T):
        for tap in range(3):  # tap 2 reads token t, tap 0 token t - 2
            if t - 2 + tap >= 0:
                conv[:, t] += enc.w_conv[layer][:, tap] * low[:, t - 2 + tap]
    w = F.silu(conv).view(B, T, H, C // H)
    w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-6)
    beta = 2 * torch.sigmoid(h @ enc.beta_weight[layer].T + enc.beta_bias[layer])
    return w, beta


def visible(i, j, window, sinks):
    return j <= i and (window is None or j > i - window or j < sinks)


def reference_head(q, k, v, w, beta, window, sinks):
    """One sequence's and head's attention output (T, D) in float64: q, k, v (T, D), w (T, D), beta (T,), each
    pair's D x D product H_i ... H_{j+1} built as a matrix, one H at a time."""
    T, D = q.shape
    eye = torch.eye(D, dtype=torch.float64)
    logits = torch.full((T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        product = eye.clone()  # H_i ... H_{j+1}, empty at j = i
        for j in range(i, -1, -1):
            if visible(i, j, window, sinks):
                logits[i, j] = q[i] @ product @ k[j] / math.sqrt(D)
            product = product @ (eye - beta[j] * torch.outer(w[j], w[j]))
    return torch.softmax(logits, -1) @ v


def reference_forward(model, idx, window=None, sinks=0):
    """The model's forward (pre-LN blocks, tied head) in float64 with PaTH's attention written out
    (``reference_head``, per sequence and head)."""
    m = copy.deepcopy(model).double()
    H, C = m.cfg.n_heads, m.cfg.d_model
    x = m.tok_emb(idx)
    for layer, block in enumerate(m.blocks):
        h = block.ln1(x)
        w, beta = reference_householder(m.encoding, h, layer)  # (B, T, H, D), (B, T, H)
        # (B, T, C) -> (B, T, H, D) each
        q, k, v = (t.unflatten(-1, (H, C // H)) for t in block.attn.qkv(h).split(C, dim=2))
        y = torch.stack([torch.stack([reference_head(q[b, :, hd], k[b, :, hd], v[b, :, hd], w[b, :, hd],
                                                     beta[b, :, hd], window, sinks) for hd in range(H)], dim=1)
                         for b in range(idx.shape[0])])  # (B, T, H, D)
        x = x + block.attn.proj(y.flatten(2))
        x = x + block.mlp(block.ln2(x))
    return m.lm_head(m.ln_f(x))


def path_model(row="path", window=None, max_mask_bytes=None, seed=0):
    extra = {} if max_mask_bytes is None else {"max_mask_bytes": max_mask_bytes}
    model = DecoderLM(CFG, row, 16, seed=seed, window=window, **extra).eval()
    with torch.no_grad():  # unit w (far above the norm's eps) and beta across (0, 2), different per layer and head
        model.encoding.w_down.mul_(10)
        model.encoding.w_up.mul_(10)
        model.encoding.w_conv.mul_(50)
        model.encoding.beta_bias.copy_(torch.randn(2, 4, generator=torch.Generator().manual_seed(7)) * 2)
        model.encoding.beta_weight.mul_(20)
    return model


@pytest.mark.parametrize("row,window,chunked,sinks,block", [
    ("path", None, False, 0, 64), ("path", None, False, 0, 16), ("path", None, False, 0, 4),
    ("path", None, True, 0, 4), ("path", 6, True, 0, 3), ("path+sink2+sw6", None, True, 2, 4)])
def test_whole_model_equals_path_attention_pair_by_pair(row, window, chunked, sinks, block, monkeypatch):
    """Beyond the train length (20 > 16), in one chunk and in query chunks of 2-3 rows, with a sliding window
    and with attention sinks beside it (the H of every token between a sink and the query still applies); in
    one block of 64 tokens (the default) or 16, and in blocks of 3 and 4 (queries carried back across several
    whole blocks)."""
    monkeypatch.setattr("posenc_bench.encodings.path.BLOCK", block)
    model = path_model(row, window, 4 * 4 * 20 * 8 * 3 if chunked else None)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model.double()(idx), reference_forward(model, idx, window or (6 if sinks else None), sinks)
    assert (got - want).abs().max() < 1e-5


def test_block_transforms_are_made_once_per_forward_not_once_per_query_chunk(monkeypatch):
    """In query chunks of 2-3 rows the blocks' transforms are made once per layer and forward (from w and beta of
    the whole window), and the logits are those of each chunk making its own range's transforms."""
    from posenc_bench.encodings import path

    monkeypatch.setattr(path, "BLOCK", 16)
    model = path_model(max_mask_bytes=4 * 4 * 20 * 8 * 3).double()
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    made = []
    real = path.block_transforms
    monkeypatch.setattr(path, "block_transforms", lambda w, beta: made.append(w.shape) or real(w, beta))
    with torch.no_grad():
        cached = model(idx)
        assert [shape[2:4] for shape in made] == [(2, 16)] * 2  # 2 layers: the window's 2 blocks of 16, once each
        made.clear()
        read = path.PaTHAttention.read
        monkeypatch.setattr(path.PaTHAttention, "read", lambda self, x, layer: (*read(self, x, layer)[:2], None))
        per_chunk = model(idx)
    assert len(made) > 2 * 2  # without the cache: every chunk of every layer makes its range's
    assert (cached - per_chunk).abs().max() < 1e-12


def test_block_transforms_are_the_products_and_the_authors_forward_substitution():
    """I - shift is H_{a+L-1} ... H_a, multiplied out one H at a time, for beta across (0, 2) (reflections,
    projections and the identity at beta 0); U is the matrix the authors' ``naive_path_attn`` builds row by row
    (``T_mat``: the loop over i of T[i, :i] += sum T[i, :, None] T[:, :i], then + I)."""
    from posenc_bench.encodings.path import block_transforms

    gen = torch.Generator().manual_seed(2)
    w = F.normalize(torch.randn(1, 2, 3, 6, 5, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(1, 2, 3, 6, generator=gen, dtype=torch.float64)
    beta[0, 1, 2, 3] = 0.0
    blocks = block_transforms(w, beta)
    wb, u, shift = blocks.wb, blocks.u, blocks.shift
    assert torch.equal(blocks.uwb, u @ wb) and torch.equal(blocks.sub(slice(1, 3)).shift, shift[:, :, 1:3])
    eye = torch.eye(5, dtype=torch.float64)
    t_mat = -(wb @ w.transpose(-1, -2)).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(), 0)
    for i in range(1, 6):
        t_mat[..., i, :i] = t_mat[..., i, :i] + (t_mat[..., i, :, None] * t_mat[..., :, :i]).sum(-2)
    assert torch.allclose(u, t_mat + torch.eye(6, dtype=torch.float64), atol=1e-12)
    for h in range(2):
        for n in range(3):
            product = eye
            for r in range(5, -1, -1):  # H_{a+5} ... H_a
                product = product @ (eye - beta[0, h, n, r] * torch.outer(w[0, h, n, r], w[0, h, n, r]))
            assert torch.allclose(eye - shift[0, h, n], product, atol=1e-12)


def test_keys_are_carried_once_per_block_and_chunks_out_of_order_start_afresh(monkeypatch):
    """Each whole block's keys are carried to its end once per forward (blocks of 4: the 4 before the last of 20
    tokens, per layer), with the logits of carrying them again in every chunk; a cache given chunks out of query
    order (a window's later chunk sees fewer keys) starts afresh and stays exact."""
    from posenc_bench.encodings import path

    monkeypatch.setattr(path, "BLOCK", 4)
    model = path_model(max_mask_bytes=4 * 4 * 20 * 8 * 3).double()
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    carried = []
    real = path._carry
    monkeypatch.setattr(path, "_carry", lambda keys, blocks, terms=None: carried.append(keys.shape[2])
                        or real(keys, blocks, terms))
    with torch.no_grad():
        want = reference_forward(model, idx)
        assert (model(idx) - want).abs().max() < 1e-5
    assert sum(carried) == 2 * 4 and len(carried) > 2  # in pieces as chunks reach new blocks
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 2, 13, 5, generator=gen, dtype=torch.float64)
    w = F.normalize(torch.randn(1, 2, 13, 5, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(1, 2, 13, generator=gen, dtype=torch.float64)
    late, early = (torch.arange(10, 13), torch.arange(7, 13)), (torch.arange(9, 10), torch.arange(6, 10))
    cache = {}
    for q_pos, k_pos in (late, early):  # the late chunk sees keys 7.. of block 6..8; the early one needs key 6
        got = householder_logits(q[:, :, q_pos], k[:, :, k_pos], w, beta, q_pos, k_pos, 3, cache)
        assert torch.equal(got, householder_logits(q[:, :, q_pos], k[:, :, k_pos], w, beta, q_pos, k_pos, 3))


def test_a_forward_in_one_chunk_makes_each_blocks_key_terms_once(monkeypatch):
    """Training's forward (every query in one chunk): the key terms serve both the keys carried to their block's
    end and the pairs inside each query block, made once for each of the 5 blocks of 4 in 20 tokens, per layer,
    and the logits stay exact."""
    from posenc_bench.encodings import path

    monkeypatch.setattr(path, "BLOCK", 4)
    model = path_model().double()
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    made = []
    real = path._key_terms
    monkeypatch.setattr(path, "_key_terms", lambda keys, blocks: made.append(keys.shape[2]) or real(keys, blocks))
    with torch.no_grad():
        want = reference_forward(model, idx)
        made.clear()
        assert (model(idx) - want).abs().max() < 1e-5
    assert made == [5] * CFG.n_layers


@pytest.mark.parametrize("block", [1, 3, 4, 16, 64])
def test_logits_equal_the_products_for_any_block_and_chunk(block):
    """The chunk's logits (queries 9..12, keys 0 and 4..12) equal q_i^T H_i ... H_{j+1} k_j for every block size."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 2, 13, 5, generator=gen, dtype=torch.float64)
    w = F.normalize(torch.randn(1, 2, 13, 5, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(1, 2, 13, generator=gen, dtype=torch.float64)
    k_pos = torch.tensor([0, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    got = householder_logits(q[:, :, 9:], k[:, :, k_pos], w, beta, torch.arange(9, 13), k_pos, block)
    eye = torch.eye(5, dtype=torch.float64)
    for h in range(2):
        for a, i in enumerate(range(9, 13)):
            for c, j in enumerate(k_pos.tolist()):
                if j > i:
                    continue
                product = eye
                for t in range(i, j, -1):
                    product = product @ (eye - beta[0, h, t] * torch.outer(w[0, h, t], w[0, h, t]))
                assert torch.allclose(got[0, h, a, c], q[0, h, i] @ product @ k[0, h, j], atol=1e-12)


def test_identity_transformations_are_nope_and_the_future_never_leaks():
    """beta = 0 (or w = 0) makes every H the identity: the model is NoPE's on the same shared weights. Changing
    tokens after t (through the conv and the products) moves no output at or before t."""
    path, nope = DecoderLM(CFG, "path", 16, seed=1).eval(), DecoderLM(CFG, "nope", 16, seed=1).eval()
    idx = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = nope(idx)
        assert not torch.allclose(path(idx), want, atol=1e-5)
        path.encoding.beta_bias.fill_(-1e4)  # 2 sigmoid(-1e4) = 0
        assert torch.allclose(path(idx), want, atol=1e-6)
        path = DecoderLM(CFG, "path", 16, seed=1).eval()
        path.encoding.w_up.zero_()
        assert torch.allclose(path(idx), want, atol=1e-6)
        model = path_model()
        before, other = model(idx), idx.clone()
        other[0, 11:] = (other[0, 11:] + 1) % 256
        after = model(other)
    assert torch.equal(before[0, :11], after[0, :11]) and not torch.allclose(before[0, 11:], after[0, 11:])


def test_a_reflection_keeps_norms_and_a_projection_shrinks_them():
    """beta = 2 makes each H a reflection (orthogonal): sum over a basis of keys e_m of (q_i^T P e_m)^2 is
    |P^T q_i|^2 = |q_i|^2 for every key j <= i. beta = 1 makes H a projection: the norm never grows, and shrinks
    past j = i."""
    enc = path_model().encoding
    x = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(4))
    q = torch.randn(1, 4, 12, 8, generator=torch.Generator().manual_seed(5))
    pos = torch.arange(12)
    lower = torch.tril(torch.ones(12, 12, dtype=torch.bool))
    for bias, keeps in ((1e4, True), (0.0, False)):
        with torch.no_grad():
            enc.beta_bias.fill_(bias)
            enc.beta_weight.zero_()
            w, beta = enc.householder(x, 1)
        assert torch.allclose(beta, torch.full_like(beta, 2.0 if keeps else 1.0))
        basis = [torch.zeros(1, 4, 12, 8).index_fill(-1, torch.tensor([m]), 1.0) for m in range(8)]  # every key e_m
        squares = sum(householder_logits(q, e, w, beta, pos, pos) ** 2 for e in basis)  # (1, 4, 12, 12)
        norms = (q * q).sum(-1)[..., None].expand(-1, -1, -1, 12)  # |q_i|^2 along every key
        assert torch.allclose(squares.diagonal(dim1=-2, dim2=-1), norms[..., 0], rtol=1e-5)
        off = lower & ~torch.eye(12, dtype=torch.bool)
        if keeps:
            assert torch.allclose(squares[..., lower], norms[..., lower], rtol=1e-4)
        else:
            assert (squares[..., off] <= norms[..., off] * (1 + 1e-6)).all()
            assert (squares[..., off] < norms[..., off] * 0.99).float().mean() > 0.5


def test_initialised_as_the_authors_and_trained_parameters_reload():
    """Weights N(0, 0.02), beta's bias 0 (``_init_weights``), w's rank 32 and a conv of 3 taps. One training step
    moves every parameter; the checkpoint reloads to the same outputs; each layer reads its own."""
    enc = build("path", d_model=64, n_heads=4, train_len=16, n_layers=3)
    assert enc.w_down.shape == (3, 32, 64) and enc.w_up.shape == (3, 64, 32) and enc.w_conv.shape == (3, 64, 3)
    assert enc.beta_weight.shape == (3, 4, 64) and torch.equal(enc.beta_bias, torch.zeros(3, 4))
    for p in (enc.w_down, enc.w_up, enc.w_conv, enc.beta_weight):
        assert abs(p.std().item() - 0.02) < 0.003
    model = DecoderLM(CFG, "path", 16, seed=0)
    idx = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    for name, p in model.encoding.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    again = DecoderLM(CFG, "path", 16, seed=5)
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model.eval()(idx), again.eval()(idx))
        before = model(idx)
        for p in model.encoding.parameters():
            p.copy_(p.flip(0))
        assert not torch.allclose(before, model(idx), atol=1e-5)
    with pytest.raises(ValueError, match="layers 0..1"):
        model.encoding.for_layer(2)
    with pytest.raises(RuntimeError, match="for_tokens"):
        model.encoding.attention_logits(None, None, None, None, None, 1.0)
    view = model.encoding.for_layer(0).for_tokens(torch.randn(1, 4, 32))
    with pytest.raises(ValueError, match="token indices"):
        view.attention_logits(torch.zeros(1, 4, 4, 8), torch.zeros(1, 4, 4, 8), torch.arange(4)[None],
                              torch.arange(4)[None], torch.zeros(1, 1, 4, 4), 1.0)
