"""Stick-breaking attention (Tan et al., ICLR 2025): the model's output against a reference written here with
explicit loops over i and j and the product of (1 - beta) (one chunk, query chunks smaller than the window,
past the train length, attention sinks); the weights' properties (non-negative, the stick's shares summing to
at most 1 with the remainder on the own value, nearest first, a window only truncating, causal, finite at
long windows with large logits); the hand-written backward against gradcheck and against autograd through the
definition; a training run."""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.bench.config import TrainConfig
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.bench.train.loop import train
from posenc_bench.data import TrainBatches
from posenc_bench.encodings.stickbreaking import (StickBreaking, StickBreakingAttention, stickbreaking_attention,
                                                  stickbreaking_logits)
from posenc_bench.errors import UnknownEncodingError
from posenc_bench.model.plan import AttentionPlan, Facts, choose_path
from posenc_bench.model.transformer import DecoderLM, ModelConfig

TRAIN = 16
CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4)


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def reference_weights(z: list, visible) -> list:
    """Stick-breaking weights of one head written out: z[i][j] the scaled logits, ``visible(i, j)`` the keys
    j < i query i sees. A[i][j] = sigmoid(z_ij) * prod over visible k, j < k < i, of (1 - sigmoid(z_ik)); the
    remainder 1 - sum_j A[i][j] on A[i][i], the query's own value."""
    T = len(z)
    A = [[0.0] * T for _ in range(T)]
    for i in range(T):
        for j in range(i):
            if visible(i, j):
                A[i][j] = sigmoid(z[i][j])
                for k in range(j + 1, i):
                    if visible(i, k):
                        A[i][j] *= 1 - sigmoid(z[i][k])
        A[i][i] = 1 - sum(A[i][:i])
    return A


def reference_model(model: DecoderLM, idx: torch.Tensor, visible) -> torch.Tensor:
    """The model's logits with each layer's attention from ``reference_weights``: the same layers and weights,
    the attention weights built key by key (no positions anywhere: the encoding embeds and rotates nothing)."""
    B, T = idx.shape
    H = model.cfg.n_heads
    D = model.cfg.d_model // H
    x = model.tok_emb(idx)
    for block in model.blocks:
        q, k, v = block.attn.qkv(block.ln1(x)).split(model.cfg.d_model, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # (B, T, C) -> (B, H, T, D)
        z = (q @ k.transpose(-1, -2)) / math.sqrt(D)  # (B, H, T, T)
        A = torch.tensor([[reference_weights(z[b, h].tolist(), visible) for h in range(H)] for b in range(B)],
                         dtype=x.dtype)  # (B, H, T, T)
        y = (A @ v).transpose(1, 2).reshape(B, T, model.cfg.d_model)  # (B, H, T, D) -> (B, T, C)
        x = x + block.attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x))


def model_of(name="stickbreaking", window=None, max_mask_bytes=1 << 20) -> DecoderLM:
    """A small random model in float64 whose q . k spread over several units (sharp and flat breaks)."""
    model = DecoderLM(CFG, name, TRAIN, window=window, seed=0, max_mask_bytes=max_mask_bytes).double().eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(12.0)
    return model


def budget(rows: int, T: int, batch: int = 2) -> int:
    """The mask byte budget that gives evaluation's logits path chunks of ``rows`` queries at T tokens (the
    plan's size: one float32 (B, H, q, k) tensor a pair for each of ``LOGIT_TENSORS``)."""
    return rows * 4 * CFG.n_heads * batch * AttentionPlan.LOGIT_TENSORS * T


def window_rule(window):
    return (lambda i, j: True) if window is None else (lambda i, j: j > i - window)


@pytest.mark.parametrize("T,window,max_mask_bytes", [
    (TRAIN, None, 1 << 20),  # one chunk at the train length
    (3 * TRAIN, None, 1 << 20),  # past the train length, one chunk
    (3 * TRAIN, None, budget(4, 3 * TRAIN)),  # chunks of 4 queries: later chunks' keys start before them
    (3 * TRAIN, 12, budget(4, 3 * TRAIN)),  # a sliding window of 12 keys, chunks of 4 queries (smaller than it)
])
def test_the_model_equals_the_written_out_stick_breaking(T, window, max_mask_bytes):
    model = model_of(window=window, max_mask_bytes=max_mask_bytes)
    with torch.no_grad():  # evaluation's chunks (training's are TRAIN_LOGIT_ROWS queries)
        plan = AttentionPlan(model.encoding, torch.arange(T), window, max_mask_bytes, batch=2)
    assert plan.path == "logits"
    if max_mask_bytes < 1 << 20:  # the byte budget forces chunks of 4 queries
        assert max(qe - qs for qs, qe, _ in plan.chunks) == 4 and len(plan.chunks) == T // 4
    idx = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        got, want = model(idx), reference_model(model, idx, window_rule(window))
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert (got - model_of(window=window)(idx)).abs().max() < 1e-9  # chunked = one chunk


def test_a_sink_row_is_stick_breaking_over_the_cache():
    """``stickbreaking+sink2+sw6`` past its cache: query i sees keys 0, 1 and its last 6; only those break the
    stick (a hidden key between a sink and the window breaks nothing)."""
    model = model_of("stickbreaking+sink2+sw6")
    T = 20
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got, want = model(idx), reference_model(model, idx, lambda i, j: j < 2 or j > i - 6)
        window_only = reference_model(model, idx, lambda i, j: j > i - 6)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert (got - window_only).abs().max() > 1e-3  # the sinks are seen


def chunk_mask(Q, K, window=None):
    """The mask of the last Q queries of K keys (0 visible, -inf not): causal, and within ``window`` keys."""
    rel = torch.arange(K)[None] - torch.arange(K - Q, K)[:, None]  # (Q, K): key minus query index
    allowed = (rel <= 0) & (rel > -window) if window else rel <= 0
    return torch.zeros(1, 1, Q, K, dtype=torch.float64).masked_fill(~allowed, float("-inf"))


def random_qkv(B, H, Q, K, D, spread=3.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, n, D, generator=g, dtype=dtype) * s for n, s in ((Q, spread), (K, spread), (K, 1.0)))


@pytest.mark.parametrize("window", [None, 5])
def test_weights_are_non_negative_and_the_remainder_is_what_the_stick_has_left(window):
    B, H, Q, K, D = 2, 3, 6, 14, 8
    q, k, _ = random_qkv(B, H, Q, K, D)
    mask, scale = chunk_mask(Q, K, window), D ** -0.5
    P = stickbreaking_logits(q, k, mask, scale).exp()  # (B, H, q, k)
    own = torch.zeros(Q, K, dtype=torch.bool)
    own[torch.arange(Q), torch.arange(K - Q, K)] = True
    shares, remainder = P.masked_fill(own, 0.0), P[..., own].view(B, H, Q)
    assert (shares >= 0).all() and (shares[..., ~torch.isfinite(mask[0, 0])] == 0).all()  # hidden keys: 0
    assert (shares.sum(-1) <= 1).all() and (remainder >= 0).all()
    # 1 - beta = sigmoid(-z), exact where beta rounds to 1; 1 for the keys that break nothing
    left = torch.sigmoid(-q @ k.transpose(-1, -2) * scale).masked_fill(own | ~torch.isfinite(mask[0, 0]), 1.0)
    torch.testing.assert_close(remainder, left.prod(-1), rtol=1e-12, atol=0)  # prod over the seen keys
    torch.testing.assert_close(shares.sum(-1) + remainder, torch.ones(B, H, Q, dtype=P.dtype), rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.softmax(stickbreaking_logits(q, k, mask, scale), -1), P, rtol=0, atol=1e-15)


def test_a_window_keeps_the_weights_it_shows_and_hands_the_rest_to_the_remainder():
    q, k, _ = random_qkv(1, 2, 5, 12, 8, seed=1)
    full, windowed = (stickbreaking_logits(q, k, chunk_mask(5, 12, w), 8 ** -0.5).exp() for w in (None, 4))
    seen = torch.isfinite(chunk_mask(5, 12, 4)[0, 0])
    seen[torch.arange(5), torch.arange(7, 12)] = False  # the own keys: the remainders, compared below
    assert torch.equal(windowed[..., seen], full[..., seen])
    dropped = full.masked_fill(torch.isfinite(chunk_mask(5, 12, 4)[0, 0]), 0.0).sum(-1)
    own = torch.arange(7, 12)
    torch.testing.assert_close(windowed[..., torch.arange(5), own], full[..., torch.arange(5), own] + dropped)


def test_nearest_first_a_key_moved_further_back_with_the_same_logit_never_gains():
    """One key (the same q . k) slid from nearest to farthest among 15 others: its weight falls at every step."""
    g = torch.Generator().manual_seed(2)
    D, n = 8, 16
    q, others, target = (torch.randn(1, 1, m, D, generator=g, dtype=torch.float64) * 2 for m in (1, n - 1, 1))
    own = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64)
    weights = []
    for back in range(n):  # keys oldest first; ``target`` has ``back`` others between it and the query's own key
        keys = torch.cat((others[..., :n - 1 - back, :], target, others[..., n - 1 - back:, :], own), dim=-2)
        P = stickbreaking_logits(q, keys, chunk_mask(1, n + 1), D ** -0.5).exp()
        weights.append(P[0, 0, 0, n - 1 - back].item())
    assert all(later < earlier for earlier, later in zip(weights, weights[1:])), weights


def test_a_future_token_never_changes_an_earlier_output():
    model = model_of(window=None, max_mask_bytes=budget(4, 40))  # chunks of 4 queries
    idx = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3))
    changed = idx.clone()
    changed[:, 23:] = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before, after = model(idx), model(changed)
    assert torch.equal(before[:, :23], after[:, :23]) and (before[:, 23:] - after[:, 23:]).abs().max() > 1e-3


@pytest.mark.parametrize("spread", [80.0, -80.0, 0.0])  # every break sharp (logits +-80 and more) or all 1/2
def test_a_long_window_with_large_logits_stays_finite_and_accurate(spread):
    """8192 keys in float32, as the authors' kernel in log space: no NaN, the weights still sum to 1, and the
    output and gradients match a float64 computation. Logits of +80: the nearest key takes (nearly) all; -80:
    the remainder, the query's own value, does."""
    B, H, Q, K, D = 1, 2, 4, 8192, 8
    g = torch.Generator().manual_seed(6)
    q = torch.ones(B, H, Q, D, dtype=torch.float64) * (1 if spread >= 0 else -1)
    k = torch.ones(B, H, K, D, dtype=torch.float64) * abs(spread) / math.sqrt(D) + torch.randn(B, H, K, D, generator=g)
    v, dout = torch.randn(B, H, K, D, generator=g, dtype=torch.float64), torch.randn(B, H, Q, D, generator=g, dtype=torch.float64)
    mask, scale = chunk_mask(Q, K).float(), D ** -0.5
    results = []
    for dtype in (torch.float32, torch.float64):
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = stickbreaking_attention(*inputs, mask, scale)
        results.append((out, *torch.autograd.grad(out, inputs, dout.to(dtype))))
        P = stickbreaking_logits(*inputs[:2], mask, scale).detach().exp()
        assert torch.isfinite(P).all() and torch.allclose(P.sum(-1).double(), torch.ones(B, H, Q, dtype=torch.float64))
    for name, got, want in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=name)
    nearest, own = v[..., K - Q - 1:K - 1, :], v[..., K - Q:, :]  # (B, H, Q, D): the key before each query, its own
    if spread > 0:
        torch.testing.assert_close(results[1][0], nearest, rtol=0, atol=1e-6)
    elif spread < 0:
        torch.testing.assert_close(results[1][0], own, rtol=0, atol=1e-6)


@pytest.mark.parametrize("Q,K,window", [(5, 5, None), (4, 11, None), (4, 11, 3)])
def test_the_hand_written_backward_passes_gradcheck_and_equals_autograd_through_the_definition(Q, K, window):
    q, k, v = random_qkv(2, 2, Q, K, 4, spread=2.0, seed=Q * K)
    mask, scale = chunk_mask(Q, K, window), 0.5
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *x: StickBreakingAttention.apply(*x, mask, scale), inputs)
    dout = torch.randn(2, 2, Q, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    mine = torch.autograd.grad(stickbreaking_attention(*inputs, mask, scale), inputs, dout)
    by_definition = torch.autograd.grad(stickbreaking_logits(*inputs[:2], mask, scale).exp() @ inputs[2], inputs, dout)
    for name, got, want in zip("qkv", mine, by_definition):
        assert got.abs().sum() > 0, name
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=name)


def gradients(model, idx):
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    names, params = zip(*model.named_parameters())
    return dict(zip(names, torch.autograd.grad(loss, params)))


@pytest.mark.parametrize("window", [None, 10])
def test_every_gradient_of_a_chunked_model_equals_softmax_of_the_logits_by_autograd(monkeypatch, window):
    """The model's training chunks (16 queries, keys before them, a window) through ``attention_output`` and
    through softmax(attention_logits) @ v, the explicit path an encoding without its own output takes."""
    monkeypatch.setattr(AttentionPlan, "TRAIN_LOGIT_ROWS", 16)
    models = [DecoderLM(CFG, "stickbreaking", TRAIN, window=window, seed=0) for _ in range(2)]
    models[0].encoding.has_attention_output = False
    assert StickBreaking.has_attention_output and models[1].encoding.has_attention_output
    idx = torch.randint(0, 256, (2, 41), generator=torch.Generator().manual_seed(8))
    assert len(AttentionPlan(models[1].encoding, torch.arange(40), window, 1 << 20, batch=2).chunks) == 3
    want, got = gradients(models[0], idx), gradients(models[1], idx)
    for name in want:
        assert torch.isfinite(got[name]).all() and got[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


def test_under_bf16_autocast_the_weights_are_still_computed_in_float32():
    """q, k, v come in bf16 (the projections autocast); the stick's sums run in float32 whatever autocast says,
    so the loss and gradients stay near the float32 model's."""
    model = DecoderLM(CFG, "stickbreaking", TRAIN, seed=0)
    idx = torch.randint(0, 256, (2, 4 * TRAIN + 1), generator=torch.Generator().manual_seed(9))
    want = gradients(model, idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = gradients(model, idx)
    for name in want:
        assert torch.isfinite(got[name]).all(), name
        assert (got[name] - want[name]).norm() < 0.1 * want[name].norm(), name


def test_the_row_declares_what_it_reads_and_where_it_runs():
    """No positions (no ``+rand`` row), no bias (no FlexAttention score_mod): the explicit path on every device;
    no parameters of its own; the contextual family; the model's scale 1/sqrt(D), the authors' default."""
    assert encodings.get_class("stickbreaking") is StickBreaking and "stickbreaking" in encodings.trained()
    assert encodings.family(StickBreaking) == "contextual" and StickBreaking.newer
    assert not (StickBreaking.batched_positions or StickBreaking.has_bias or StickBreaking.has_score_mod)
    assert "stickbreaking+rand" not in encodings.available()
    with pytest.raises(UnknownEncodingError):
        encodings.get_class("stickbreaking+rand")
    for facts in (Facts(), Facts(flex=True, grad=True, bias_kernel=True), Facts(window=8), Facts(window=8, sinks=2)):
        assert choose_path(StickBreaking, facts) == "logits"
    assert list(encodings.build("stickbreaking", d_model=32, n_heads=4, train_len=TRAIN).parameters()) == []
    with pytest.raises(ValueError, match="4 queries needs at least 4 keys"):
        stickbreaking_attention(*random_qkv(1, 1, 4, 3, 4), torch.zeros(1, 1, 4, 3), 0.5)


def test_a_training_run_learns():
    stream = torch.where(torch.rand(20000, generator=torch.Generator().manual_seed(0)) < 0.1,
                         torch.randint(0, 256, (20000,), generator=torch.Generator().manual_seed(1)),
                         torch.arange(20000) % 37).to(torch.int16)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "stickbreaking", TRAIN, seed=0)
    cfg = TrainConfig(train_len=TRAIN, batch_size=8, steps=30, lr=3e-3, warmup_steps=5, log_every=10)
    out = train(model, TrainBatches(stream, TRAIN, 8, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False))
    assert out.status == "ok" and out.steps == 30
    assert out.curve[-1][1] < out.curve[0][1] - 0.5
