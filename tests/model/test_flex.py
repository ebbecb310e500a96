"""The FlexAttention paths (model/flex.py) equal today's paths.

On the CPU this torch's FlexAttention runs its forward eagerly and has no backward: there every encoding's
score_mod is checked by calling the flex path on CPU tensors under no_grad against the path the CPU takes today
(and the bias mask CUDA takes today), and the BlockMasks against the plan's masks pair by pair (the eager
forward applies the mask_mod everywhere and ignores the block lists, so the lists are checked on their own).
The gradients, and the compiled kernels, are checked on a GPU (skipped without one):
``pytest tests/model/test_flex.py``.
"""

import copy
import types
import warnings

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model import attention, flex, plan as attention_plan
from posenc_bench.model.explicit import attention_lse, parts_attention
from posenc_bench.model.plan import AttentionPlan, Chunk, Facts, choose_path, query_chunks
from posenc_bench.model.transformer import DecoderLM, ModelConfig

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

TRAIN, B, H, D, T = 64, 2, 4, 8, 300  # T: three BlockMask blocks, the last one short; +rand's M = 512 >= T
BIAS_ROWS = [n for n in encodings.trained() if encodings.get_class(n).has_bias]
# FIRE: L below T, so its normaliser max(L, i) moves within the window; a narrower MLP keeps the eager CPU
# forward (every pair through the unrolled MLP) fast
OPTIONS = {"threshold": 64.0, "mlp_width": 8}


# +rand rows under both samplers: the earlier per-sequence positions (B, T), and the authors' per-layer views
CASES = [(n, None) for n in BIAS_ROWS if not n.endswith("+rand")] + [
    (n, s) for n in BIAS_ROWS if n.endswith("+rand") for s in ("per-sequence", "authors")]


def _encoding(name: str, sampler: str = "per-sequence") -> encodings.Encoding:
    options = dict(OPTIONS) if "fire" in name else {}
    if name.endswith("+rand"):
        options.update(sampler=sampler, eval_positions="random")
        if "fire" in name:  # M >= T: fire+rand's default is 2 x TRAIN
            options["max_position"] = 1024
    enc = encodings.build(name, d_model=H * D, n_heads=H, train_len=TRAIN, options=options).eval()
    enc.set_eval_length(T)
    return enc


def _attending(name: str, sampler) -> tuple[encodings.Encoding, torch.Tensor]:
    """The encoding a layer attends with and the positions its plan is made from: under the authors' sampler,
    layer 0's view and its drawn positions (or slots, with drawn distances)."""
    enc = _encoding(name, sampler)
    pos = enc.positions(B, T, torch.device("cpu"))
    if sampler == "authors":
        enc = enc.for_layer(0)
        assert enc.own_positions
        pos = enc.positions(B, T, torch.device("cpu"))
    else:
        assert pos.dim() == (2 if name.endswith("+rand") else 1)
    return enc, pos


def _flex_plan(monkeypatch, enc, pos, window) -> AttentionPlan:
    """The plan CUDA makes: FlexAttention on, no folding; emulated on the CPU."""
    monkeypatch.setattr(attention_plan, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(attention_plan, "FOLD_DEVICES", ())
    with torch.no_grad():
        plan = AttentionPlan(enc, pos, window, 64 << 20, batch=B)
    monkeypatch.undo()
    return plan


def test_every_trained_bias_encoding_has_a_score_mod():
    assert {"t5", "alibi", "kerple", "kerple-power", "fire", "alibi+rand", "kerple+rand", "fire+rand"} <= set(BIAS_ROWS)
    for name in BIAS_ROWS:
        enc = _encoding(name)
        assert enc.has_score_mod and callable(enc.score_mod(torch.arange(4), torch.arange(4))), name
    assert encodings.build("rope", d_model=32, n_heads=4, train_len=16).score_mod(torch.arange(4), torch.arange(4)) is None


def _tensors(fn, seen=None) -> list[torch.Tensor]:
    """Every tensor a score_mod's closures hold (through nested functions; not modules' parameters)."""
    seen = set() if seen is None else seen
    out = []
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif callable(value) and not isinstance(value, torch.nn.Module) and id(value) not in seen:
            seen.add(id(value))
            out += _tensors(value, seen)
    return out


@pytest.mark.parametrize("name", BIAS_ROWS)
def test_a_score_mod_captures_small_tensors_only(name):
    enc, n = _encoding(name), 2000
    pos = torch.arange(n) if not name.endswith("+rand") else torch.arange(2 * n).view(2, n)
    held = _tensors(enc.score_mod(pos, pos))
    assert held and max(t.numel() for t in held) <= 2 * H * n  # positions, (H, distances) lines: never (q, k)


@pytest.mark.parametrize("window,chunked", [(None, False), (50, False), (50, True)])
@pytest.mark.parametrize("name,sampler", CASES)
def test_the_flex_path_equals_todays_paths(monkeypatch, name, sampler, window, chunked):
    """One layer's attention (B, H, T, D) on the flex path equals the CPU's path today and the bias mask that
    CUDA takes today, in one chunk and in chunks of 70 queries (offsets within each chunk's positions), with
    and without a window; +rand rows on per-sequence positions (B, T) and on the authors' per-layer draws."""
    budget = 4 * H * B * T * 70 if chunked else 64 << 20  # today's chunks: 70 or 140 queries
    enc, pos = _attending(name, sampler)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    scale = D**-0.5
    plan = _flex_plan(monkeypatch, enc, pos, window)
    assert plan.path == "flex" and plan.chunks == [(0, T, 0)] and not plan.mask_bias and plan.mask(0, q.dtype) is None
    if chunked:
        plan.chunks = query_chunks(T, 70, window, None)
    with torch.no_grad():
        got = attention.attend(enc, plan, q, k, v, scale)
        cpu = attention.attend(enc, AttentionPlan(enc, pos, window, budget, batch=B), q, k, v, scale)
        monkeypatch.setattr(attention_plan, "FOLD_DEVICES", ())  # CUDA today: the bias in a float mask
        masked = AttentionPlan(enc, pos, window, budget, batch=B)
        assert masked.path == "mask" and (len(masked.chunks) > 1) == chunked
        mask = attention.attend(enc, masked, q, k, v, scale)
    torch.testing.assert_close(got, mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(got, cpu, rtol=0, atol=1e-5)


def _listed(num: torch.Tensor, idx: torch.Tensor, nk: int) -> torch.Tensor:
    """(Bm, Hm, nq, nk) bool: the blocks a BlockMask lists (num per row, their indices first)."""
    grid = torch.zeros(*num.shape, nk, dtype=torch.bool)
    for row in torch.cartesian_prod(*(torch.arange(s) for s in num.shape)).view(-1, num.dim()).tolist():
        grid[tuple(row)][idx[tuple(row)][:num[tuple(row)]].long()] = True
    return grid


def _visible(block_mask, Tq: int, Tk: int) -> torch.Tensor:
    """(Bm, Hm, Tq, Tk) bool: the pairs FlexAttention's kernel attends: those of full blocks, and those of
    partial blocks its mask_mod allows."""
    nk = -(-Tk // flex.BLOCK)
    full = _listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, nk)
    partial = _listed(block_mask.kv_num_blocks, block_mask.kv_indices, nk)
    assert not (full & partial).any()

    def pairs(grid):
        return grid.repeat_interleave(flex.BLOCK, -2).repeat_interleave(flex.BLOCK, -1)[..., :Tq, :Tk]

    allowed = block_mask.mask_mod(0, 0, torch.arange(Tq)[:, None], torch.arange(Tk)[None, :])
    return pairs(full) | (pairs(partial) & allowed)


@pytest.mark.parametrize("name,window,T,budget,full", [  # full: some block has every pair visible
    ("t5", None, 300, 64 << 20, True), ("t5", 50, 300, 64 << 20, False), ("t5", 300, 700, 64 << 20, True),
    ("t5", 200, 700, 4 * 4 * 700 * 90, False), ("t5", None, 700, 4 * 4 * 700 * 300, True),  # chunks of 90, 300
    ("t5", 7, 700, 4 * 4 * 700 * 130, False), ("xpos+bca", None, 700, 64 << 20, False),
    ("xpos+bca", 100, 700, 64 << 20, False),
])
def test_block_masks_hold_exactly_the_plans_visible_pairs(name, window, T, budget, full):
    """Each chunk's BlockMask (its full and partial block lists and mask_mod) attends exactly the pairs the
    plan's mask leaves finite: causal, window, blocks (xpos+bca past its train length), chunk offsets."""
    enc = encodings.build(name, d_model=32, n_heads=4, train_len=TRAIN)
    enc.set_eval_length(T)
    plan = AttentionPlan(enc, torch.arange(T), window, budget)
    assert (plan.block is not None) == (name == "xpos+bca")
    some_full = False
    for i, (qs, qe, ks) in enumerate(plan.chunks):
        mask = plan.mask(i, torch.float32)
        want = torch.ones(qe - qs, qe - ks, dtype=torch.bool).tril(ks - qs) if mask is None else torch.isfinite(mask[0, 0])
        block_mask = flex.visible_blocks(plan, i, torch.device("cpu"))
        assert torch.equal(_visible(block_mask, qe - qs, qe - ks)[0, 0], want), (i, qs, qe, ks)
        some_full |= bool(block_mask.full_kv_num_blocks.any())
    assert some_full == full  # where blocks can be full, the full-block lists are exercised, not only mask_mod


def _masks(Tq: int, Tn: int, heads: int) -> torch.Tensor:
    """(1, heads, Tq, Tn): a bias, -inf outside a banded set, one row with no visible key."""
    g = torch.Generator().manual_seed(3)
    rel = torch.arange(Tn)[None, :] - torch.arange(Tq)[:, None] - (Tn - Tq)
    mask = torch.randn(1, heads, Tq, Tn, generator=g).masked_fill((rel > 0) | (rel < -150), float("-inf"))
    mask[..., 5, :] = float("-inf")
    return mask


@pytest.mark.parametrize("heads", [1, H])
def test_flex_attention_lse_equals_the_explicit_softmax(heads):
    Tq, Tn = 200, 330
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(B, H, Tq, D, generator=g), torch.randn(B, H, Tn, D, generator=g), torch.randn(B, H, Tn, D, generator=g)
    mask = _masks(Tq, Tn, heads)
    with torch.no_grad():
        out, lse = flex.attention_lse(q, k, v, mask, 0.3)
    logits = (q @ k.transpose(-1, -2)) * 0.3 + mask
    want = torch.logsumexp(logits, -1)
    assert lse.dtype == torch.float32 and torch.isneginf(lse[..., 5]).all() and torch.isneginf(want[..., 5]).all()
    rows = [r for r in range(Tq) if r != 5]
    torch.testing.assert_close(lse[..., rows], want[..., rows], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[..., rows, :], (torch.softmax(logits, -1) @ v)[..., rows, :], rtol=0, atol=1e-5)
    assert not out[..., 5, :].any()


@pytest.mark.parametrize("heads", [1, H])
def test_the_lse_block_mask_holds_exactly_the_finite_entries(monkeypatch, heads):
    mask = _masks(200, 330, heads)
    built = []
    real = flex.listed_blocks
    monkeypatch.setattr(flex, "listed_blocks", lambda *a: built.append(real(*a)) or built[-1])
    monkeypatch.setattr(flex, "attend_flex", lambda q, k, v, score_mod, block_mask, scale, lse: (q, q[..., 0]))
    flex.attention_lse(torch.zeros(1, H, 200, D), torch.zeros(1, H, 330, D), torch.zeros(1, H, 330, D), mask, 1.0)
    assert torch.equal(_visible(built[0], 200, 330), torch.isfinite(mask))


@pytest.mark.parametrize("name", ["rope-rerope", "rope-leaky", "rope-selfextend"])
@pytest.mark.parametrize("max_bytes", [1 << 30, 4 * 300 * 8 * 70])  # one chunk; chunks of 70 queries
def test_the_parts_path_on_flex_equals_the_whole_logits(monkeypatch, name, max_bytes):
    """What CUDA runs for the per-pair RoPE fixes (attention_lse through FlexAttention) equals softmax of
    the encoding's whole logits; emulated on the CPU."""
    enc = encodings.build(name, d_model=H * D, n_heads=H, train_len=TRAIN)
    enc.set_eval_length(T)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    calls = []
    monkeypatch.setattr(attention_plan, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(flex, "attention_lse", lambda *a, real=flex.attention_lse: calls.append(1) or real(*a))
    with torch.no_grad():
        plan = AttentionPlan(enc, torch.arange(T), 100, max_bytes, batch=B)
        assert plan.path == "parts" and (len(plan.chunks) == 1) == (max_bytes == 1 << 30)
        for i, (qs, qe, ks) in enumerate(plan.chunks):
            c = Chunk(i, q[:, :, qs:qe], k[:, :, ks:qe], v[:, :, ks:qe], plan.mask(i, q.dtype), D**-0.5)
            q_pos, k_pos = plan.chunk_positions(i)
            logits = enc.attention_logits(c.q, c.k, q_pos, k_pos, c.mask, c.scale)
            torch.testing.assert_close(parts_attention(plan, c), torch.softmax(logits, -1) @ c.v, rtol=0, atol=1e-5)
    assert calls  # the flex attention_lse ran


def test_attention_lse_takes_flex_only_on_its_devices(monkeypatch):
    calls = []
    monkeypatch.setattr(flex, "attention_lse", lambda *a: calls.append(1))
    q = torch.zeros(1, 1, 2, 4)
    attention_lse(q, q, q, torch.zeros(1, 1, 2, 2), 1.0)
    assert not calls  # the CPU keeps its kernels
    monkeypatch.setattr(attention_plan, "FLEX_DEVICES", ("cpu",))
    attention_lse(q, q, q, torch.zeros(1, 1, 2, 2), 1.0)
    assert calls


def _declaring(*flags):
    names = ("has_bias", "has_low_rank_bias", "has_distance_bias", "has_attention_logits", "has_attention_parts",
             "has_score_mod")
    return types.SimpleNamespace(**{n: n in flags for n in names})


@pytest.mark.parametrize("flags,facts,path", [
    (("has_bias", "has_score_mod"), {"flex": True}, "flex"),
    (("has_bias", "has_score_mod"), {"flex": True, "window": 8, "grad": True, "block": 16}, "flex"),
    (("has_bias", "has_score_mod"), {"flex": False}, "mask"),  # the CPU: no FlexAttention backward
    (("has_bias",), {"flex": True}, "mask"),  # no score_mod: the bias mask
    (("has_bias", "has_low_rank_bias", "has_score_mod"), {"flex": True, "fold": False}, "flex"),  # ALiBi on CUDA
    (("has_bias", "has_low_rank_bias", "has_score_mod"), {"flex": True}, "folded"),  # where the device folds
    (("has_bias", "has_score_mod"), {"flex": True, "sinks": 2, "window": 8}, "sinks"),
    (("has_bias", "has_distance_bias", "has_score_mod"), {"flex": True, "grad": True, "bias_kernel": True},
     "distance_bias"),  # where the bias kernel exists (the CPU), it stays
    (("has_attention_logits", "has_attention_parts", "has_bias", "has_score_mod"), {"flex": True}, "parts"),
    (("has_score_mod",), {"flex": True}, "fused"),  # nothing to add
])
def test_flex_is_chosen_from_the_capability_and_the_devices_fact(flags, facts, path):
    assert choose_path(_declaring(*flags), Facts(**facts)) == path
    assert path in attention.PATHS


def test_the_plan_states_flex_for_cuda_only():
    assert attention_plan.FLEX_DEVICES == ("cuda",)  # the CPU's FlexAttention has no backward in this torch
    with torch.no_grad():
        assert AttentionPlan(_encoding("t5"), torch.arange(T), None, 64 << 20).path == "mask"


# ---- on a GPU: the compiled kernels, forward and gradients -----------------------------------------------

def _run(model, x, flex_on: bool, monkeypatch, train: bool):
    monkeypatch.setattr(attention_plan, "FLEX_DEVICES", ("cuda",) if flex_on else ())
    paths = []
    real = attention.PATHS["flex"]
    monkeypatch.setitem(attention.PATHS, "flex", lambda plan, c: paths.append(plan.path) or real(plan, c))
    model.train(train)
    with torch.set_grad_enabled(train):
        logits = model(x[:, :-1])
        if train:
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()
    monkeypatch.undo()
    assert bool(paths) == flex_on
    return logits


@cuda
@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("name", BIAS_ROWS)
def test_gradients_on_flex_equal_the_mask_path_on_cuda(monkeypatch, name, window):
    """The training step's loss and every parameter's gradient (the encoding's included) on the compiled flex
    path equal those of the bias-mask path, at 160 tokens (two blocks, the second short)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, encoding_options={name: OPTIONS} if "fire" in name else {})
        ours = DecoderLM(cfg, name, TRAIN, window=window, seed=0).cuda()
    today = copy.deepcopy(ours)
    x = torch.randint(0, 256, (2, 161), generator=torch.Generator().manual_seed(2)).cuda()
    got = _run(ours, x, True, monkeypatch, train=True)
    want = _run(today, x, False, monkeypatch, train=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    encoding_grads = 0
    for (n, p), q in zip(ours.named_parameters(), today.parameters()):
        assert p.grad is not None and q.grad is not None, n
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
        encoding_grads += n.startswith("encoding.") and bool(p.grad.abs().sum() > 0)
    assert encoding_grads or not list(ours.encoding.parameters())  # the bias's parameters are reached


@cuda
@pytest.mark.parametrize("name", BIAS_ROWS)
def test_the_eval_forward_at_4x_on_flex_equals_the_mask_path_on_cuda(monkeypatch, name):
    ours = DecoderLM(ModelConfig(d_model=64, n_layers=2, n_heads=4), name, TRAIN, window=100, seed=0).cuda()
    today = copy.deepcopy(ours)
    for m in (ours, today):
        m.encoding.set_eval_length(4 * TRAIN)
    x = torch.randint(0, 256, (2, 4 * TRAIN + 1), generator=torch.Generator().manual_seed(1)).cuda()
    torch.testing.assert_close(_run(ours, x, True, monkeypatch, train=False),
                               _run(today, x, False, monkeypatch, train=False), rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("name", ["rope-rerope", "rope-leaky", "rope-selfextend"])
def test_parts_gradients_through_flex_lse_equal_the_explicit_ones_on_cuda(monkeypatch, name):
    """The parts path's flex attention_lse (gradients through its log-sum-exp included) equals the explicit
    logits' attention, forward and every gradient, at 4x the train length."""
    ours = DecoderLM(ModelConfig(d_model=64, n_layers=2, n_heads=4), name, TRAIN, seed=0).cuda()
    today = copy.deepcopy(ours)
    x = torch.randint(0, 256, (2, 4 * TRAIN + 1), generator=torch.Generator().manual_seed(3)).cuda()
    grads = []
    for m, devices in ((ours, ("cuda",)), (today, ())):
        m.encoding.set_eval_length(4 * TRAIN)
        monkeypatch.setattr(attention_plan, "FLEX_DEVICES", devices)
        logits = m(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        grads.append((logits, {n: p.grad for n, p in m.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-5)
    for n, g in grads[0][1].items():
        torch.testing.assert_close(g, grads[1][1][n], rtol=1e-3, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
