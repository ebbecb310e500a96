"""The attention-sinks path (StreamingLLM) against the paper's cache, built query by query: the visible set,
positions re-indexed within the cache for RoPE and ALiBi, the window that fits the cache (``sink_window`` and
``cache_positions``: test_plan.py).
Row names and the rows' validation: tests/encodings/test_sinks.py."""

import copy
import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import DecoderLM, ModelConfig

THETA = 10000.0


def rot(x, pos):
    """RoPE, half-split layout, written out: x (n, D) float64, row r rotated by angles pos[r] * theta^(-2i/D)."""
    D = x.shape[-1]
    inv_freq = THETA ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    ang = torch.as_tensor(pos, dtype=torch.float64)[:, None] * inv_freq
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


def alibi_slope(h, H):
    return 2.0 ** (-8.0 * (h + 1) / H)  # Press et al.: 2^(-8h/H), h = 1 .. H (H a power of two)


def cache(i, S, W):
    """Query i's visible keys with (query position, key position) in a StreamingLLM cache of S sinks and W
    recent tokens: [(j, pq, pk)]. Before the cache is full (i < S + W) every key j <= i, at its own position."""
    if i < S + W:
        return [(j, i, j) for j in range(i + 1)]
    first = i - W + 1  # recent keys i - W < j <= i sit at S .. S + W - 1, the query at S + W - 1
    return [(s, S + W - 1, s) for s in range(S)] + [(j, S + W - 1, S + j - first) for j in range(first, i + 1)]


def no_reindex(i, S, W):
    """The same visible set at the text's positions (what the cache avoids): the negative control."""
    return [(j, i, j) for j, _, _ in cache(i, S, W)]


def visible(i, S, W):
    return {j for j, _, _ in cache(i, S, W)}


def reference_forward(model, idx, S, W, kind, keys=cache):
    """The model's forward (transformer.py) in float64 with attention query by query: softmax over the query's
    visible keys of q . k / sqrt(D) with RoPE at the cache positions (kind 'rope'), or q . k / sqrt(D) minus
    slope_h x (cache distance) (kind 'alibi')."""
    m = copy.deepcopy(model).double()
    B, T = idx.shape
    H, C = m.cfg.n_heads, m.cfg.d_model
    D = C // H
    x = m.tok_emb(idx)
    for block in m.blocks:
        q, k, v = block.attn.qkv(block.ln1(x)).split(C, dim=2)
        y = torch.zeros(B, T, C, dtype=torch.float64)
        for b in range(B):
            for h in range(H):
                sl = slice(h * D, (h + 1) * D)
                for i in range(T):
                    js, pq, pk = (list(t) for t in zip(*keys(i, S, W)))
                    qi, kj = q[b, i, sl].expand(len(js), -1), k[b, js, sl]
                    if kind == "rope":
                        logits = (rot(qi, pq) * rot(kj, pk)).sum(-1) / math.sqrt(D)
                    else:
                        distance = torch.tensor(pq, dtype=torch.float64) - torch.tensor(pk, dtype=torch.float64)
                        logits = (qi * kj).sum(-1) / math.sqrt(D) - alibi_slope(h, H) * distance
                    y[b, i, sl] = torch.softmax(logits, -1) @ v[b, js, sl]
        x = x + block.attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return m.lm_head(m.ln_f(x))


def sharpen(model, factor=8.0):
    """q . k of order 1 (the init gives nearly uniform attention), so that positions show in the outputs."""
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight.mul_(factor)
    return model


def row_bytes(H, keys):  # the bytes of one query row of `keys` logits on the sink path: 4 H keys LOGIT_TENSORS
    return 4 * H * keys * AttentionPlan.LOGIT_TENSORS


@pytest.mark.parametrize("row,S,W,heads", [("rope+sink4+sw8", 4, 8, 2), ("alibi+sink2+sw8", 2, 8, 4)])
def test_model_equals_the_streaming_cache_reference(row, S, W, heads):
    T = 40
    kind = row.split("+")[0]
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=heads)
    model = sharpen(DecoderLM(cfg, row, 32, seed=0).eval())
    chunked = DecoderLM(cfg, row, 32, seed=0, max_mask_bytes=7 * row_bytes(heads, T)).eval()
    chunked.load_state_dict(model.state_dict())
    assert len(AttentionPlan(chunked.encoding, torch.arange(T), None, chunked.max_mask_bytes).chunks) > 1
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = reference_forward(model, idx, S, W, kind)
        for m in (model, chunked):
            m.encoding.set_eval_length(T)
            err = (m(idx).double() - want).abs().max()
            assert err < 1e-4, (row, err)
        # the reference tells re-indexed sinks from sinks at their text positions
        wrong = reference_forward(model, idx, S, W, kind, keys=no_reindex)
        assert (wrong - want)[0, S + W:].abs().max() > 1e-3
        assert torch.allclose(wrong[0, : S + W], want[0, : S + W])  # identical before the cache is full


def test_two_layers_and_a_batch_equal_the_reference():
    T, S, W = 30, 3, 6
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    model = sharpen(DecoderLM(cfg, f"rope+sink{S}+sw{W}", 32, seed=1).eval())
    idx = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        err = (model(idx).double() - reference_forward(model, idx, S, W, "rope")).abs().max()
    assert err < 1e-4, err


@pytest.mark.parametrize("row,window,S,W", [("rope+sink4+sw8", None, 4, 8), ("alibi+sink2+sw8", None, 2, 8),
                                            ("rope+sink4", 8, 4, 8), ("t5+sink1+sw5", None, 1, 5)])
@pytest.mark.parametrize("rows_per_chunk", [None, 1, 7])
def test_plan_masks_are_exactly_the_visible_set(row, window, S, W, rows_per_chunk):
    T = 40
    enc = encodings.build(row, d_model=32, n_heads=4, train_len=32)
    # a chunk of r queries holds at most S + W - 1 + r keys: the budget of r such rows
    budget = 64 << 20 if rows_per_chunk is None else rows_per_chunk * row_bytes(4, S + W + rows_per_chunk)
    plan = AttentionPlan(enc, torch.arange(T), window, max_mask_bytes=budget, batch=1)
    assert plan.sinks == S and plan.window == W
    if rows_per_chunk is not None:
        assert max(qe - qs for qs, qe, _ in plan.chunks) == rows_per_chunk
    rows = []
    for c, (qs, qe, ks) in enumerate(plan.chunks):
        keys = plan.chunk_keys(c, torch.arange(T), -1)  # the sinks still visible, then [ks, qe)
        p = plan.key_span(c)[0]
        assert keys.tolist() == list(range(p)) + list(range(ks, qe)) and p == min(S, ks)
        assert ks == max(0, qs - W + 1)  # no chunk holds keys its window has left behind, bar the sinks
        m = plan.mask(c, torch.float32)  # (1, H or 1, q, p + qe - ks)
        assert m.shape[-2:] == (qe - qs, len(keys))
        seen = torch.isfinite(m).all(dim=1)[0]  # every head sees the same keys
        assert torch.equal(seen, torch.isfinite(m).any(dim=1)[0])
        full = torch.zeros(qe - qs, T, dtype=torch.bool)
        full[:, keys] = seen
        rows.append(full)
    got = torch.cat(rows)
    assert got.shape == (T, T)
    for i in range(T):
        want = {j for j in range(T) if j < S or i - W < j <= i}
        want = {j for j in want if j <= i}
        assert want == visible(i, S, W), i
        assert set(torch.nonzero(got[i]).flatten().tolist()) == want, i


def test_alibi_mask_bias_is_the_cache_distance():
    T, S, W, H = 40, 2, 8, 4
    enc = encodings.build("alibi+sink2+sw8", d_model=32, n_heads=H, train_len=32)
    plan = AttentionPlan(enc, torch.arange(T), None, max_mask_bytes=64 << 20)
    assert len(plan.chunks) == 1
    m = plan.mask(0, torch.float32)[0].double()  # (H, T, T)
    for h in range(H):
        for i in range(T):
            for j, pq, pk in cache(i, S, W):
                want = -alibi_slope(h, H) * (pq - pk)
                assert abs(m[h, i, j] - want) < 1e-5, (h, i, j, m[h, i, j].item(), want)


def test_trained_with_window_form_equals_the_zero_shot_form_on_the_same_weights():
    T, S, W = 40, 4, 8
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    zero_shot = sharpen(DecoderLM(cfg, "rope+sink4+sw8", 32, seed=0).eval())
    trained = DecoderLM(cfg, "rope+sink4", 32, window=W, seed=0).eval()  # row rope+sw8+sink4
    trained.load_state_dict(zero_shot.state_dict())
    plain = DecoderLM(cfg, "rope", 32, seed=0).eval()
    plain.load_state_dict(zero_shot.state_dict())
    windowed = DecoderLM(cfg, "rope", 32, window=W, seed=0).eval()
    windowed.load_state_dict(zero_shot.state_dict())
    idx = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        a, b = zero_shot(idx), trained(idx)
        assert torch.equal(a, b)
        p, w = plain(idx), windowed(idx)
    # before the cache is full every key is visible at its own position: the model without a window
    assert torch.allclose(a[:, : S + W], p[:, : S + W], atol=1e-5)
    # for i < W nothing is cut yet: also the windowed model's logits
    assert torch.allclose(a[:, :W], w[:, :W], atol=1e-5)
    # from there on the sinks and their positions make the difference
    assert (a[:, S + W:] - p[:, S + W:]).abs().max() > 1e-3
    assert (a[:, W:] - w[:, W:]).abs().max() > 1e-3


def test_no_sinks_is_the_papers_window_attention_control():
    """rope+sink0+sw8: the unwindowed model with a zero-shot window of 8 and nothing kept: exactly the plain
    windowed model on the same weights (distances within the window are unchanged by the cache)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    windowed = DecoderLM(cfg, "rope", 16, window=8, seed=0).eval()
    control = DecoderLM(cfg, "rope+sink0+sw8", 16, seed=0).eval()
    control.load_state_dict(windowed.state_dict())
    idx = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.equal(control(idx), windowed(idx))


def test_a_window_that_fits_in_the_cache_is_the_base_model_bitwise():
    """T <= S + W: nothing is evicted and no position moves, so the row takes the base model's own path."""
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    for base in ("rope", "alibi", "t5"):
        plain = DecoderLM(cfg, base, 16, seed=0).eval()
        sinks = DecoderLM(cfg, f"{base}+sink4+sw12", 16, seed=0).eval()
        sinks.load_state_dict(plain.state_dict())
        idx = torch.randint(0, 256, (2, 16))
        with torch.no_grad():
            assert torch.equal(sinks(idx), plain(idx)), base
            assert not torch.equal(sinks(torch.cat((idx, idx), 1)), plain(torch.cat((idx, idx), 1))), base
