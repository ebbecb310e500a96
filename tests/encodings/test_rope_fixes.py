"""ReRoPE, Leaky ReRoPE and Self-Extend against the papers' per-pair relative positions, built pair by pair with a
hand-written rotation; plain rope at and below the activation length, bitwise; the whole model beyond it."""

import copy
import math
from fractions import Fraction

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.encodings import rope_fixes
from posenc_bench.errors import ConfigError
from posenc_bench.model.transformer import DecoderLM, ModelConfig

THETA = 10000.0


def rot(x, pos):
    """RoPE, half-split layout, written out: x (..., D) float64 rotated by angles pos * theta^(-2i/D), i < D/2;
    pos a number or a list of numbers, one per row of x."""
    D = x.shape[-1]
    inv_freq = THETA ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    ang = torch.as_tensor(pos, dtype=torch.float64)[..., None] * inv_freq
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


# The papers' rules: (query position, key position) to rotate q_i and k_j by, for query i and key j <= i.
def rerope_positions(i, j, w):
    r = min(i - j, w)  # Su 2023: relative positions clipped at w
    return i, i - r


def leaky_positions(i, j, w, slope):
    r = i - j if i - j < w else w + (i - j - w) / slope  # Leaky ReRoPE: beyond w, slope 1/k
    return i, i - r


def selfextend_positions(i, j, G, W):
    if i - j < W:  # neighbours: exact positions
        return i, j
    return i // G + W - W // G, j // G  # grouped (Jin et al. 2024, eq. 3 and the authors' code)


def reference_logits(q, k, positions, scale):
    """(T, T) float64 logits for one head, -inf above the diagonal: for each pair (i, j <= i) its positions by
    the rule, then (R(pq) q_i) . (R(pk) k_j) * scale (one query row rotated at once)."""
    T = q.shape[0]
    out = torch.full((T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        pq, pk = zip(*[positions(i, j) for j in range(i + 1)])
        out[i, : i + 1] = (rot(q[i].expand(i + 1, -1), pq) * rot(k[: i + 1], pk)).sum(-1) * scale
    return out


def build(name, train_len=24, **options):
    return encodings.build(name, d_model=32, n_heads=2, train_len=train_len, options=options)


def causal_mask(T):
    return torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))[None, None]


CASES = [
    ("rope-rerope", {"window": 5}, lambda i, j: rerope_positions(i, j, 5)),
    ("rope-rerope", {"window": 3}, lambda i, j: rerope_positions(i, j, 3)),
    ("rope-leaky", {"window": 5, "slope": 4.0}, lambda i, j: leaky_positions(i, j, 5, 4.0)),
    ("rope-leaky", {"window": 4}, lambda i, j: leaky_positions(i, j, 4, 16.0)),  # the author's k = 16
    ("rope-selfextend", {"neighbor_window": 4, "group": 2}, lambda i, j: selfextend_positions(i, j, 2, 4)),
    ("rope-selfextend", {"neighbor_window": 5, "group": 3}, lambda i, j: selfextend_positions(i, j, 3, 5)),
    ("rope-selfextend", {"neighbor_window": 3, "group": 4}, lambda i, j: selfextend_positions(i, j, 4, 3)),
]


@pytest.mark.parametrize("name,options,positions", CASES, ids=[f"{n}-{o}" for n, o, _ in CASES])
def test_attention_logits_equal_the_pair_by_pair_definition(name, options, positions):
    torch.manual_seed(0)
    T, D = 12, 16
    enc = build(name, **options)
    enc.set_eval_length(T)  # below the train length: its own rule still applies to the hook
    q, k = torch.randn(1, 2, T, D, dtype=torch.float64), torch.randn(1, 2, T, D, dtype=torch.float64)
    scale = 1 / math.sqrt(D)
    got = enc.attention_logits(q, k, torch.arange(T), torch.arange(T), causal_mask(T), scale)
    assert got.shape == (1, 2, T, T)
    for h in range(2):
        want = reference_logits(q[0, h], k[0, h], positions, scale)
        assert torch.equal(torch.isinf(got[0, h]), torch.isinf(want)), h
        assert torch.allclose(got[0, h].double(), want, atol=1e-5), (h, (got[0, h].double() - want).abs().max())
    # and the rule is not plain rope: some far pair differs from the exact relative position
    exact = reference_logits(q[0, 0], k[0, 0], lambda i, j: (i, j), scale)
    assert (got[0, 0].double() - exact).nan_to_num().abs().max() > 1e-3


def test_rerope_logit_is_constant_from_the_window_on_and_leaky_grows_by_one_over_k():
    torch.manual_seed(1)
    T, D, w, slope = 20, 16, 5, 4.0
    q0, k0 = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    q, k = q0.expand(1, 2, T, D).contiguous(), k0.expand(1, 2, T, D).contiguous()  # the same vectors everywhere
    pos, mask = torch.arange(T), causal_mask(T)
    rerope = build("rope-rerope", window=w).attention_logits(q, k, pos, pos, mask, 1.0)[0, 0].double()
    leaky = build("rope-leaky", window=w, slope=slope).attention_logits(q, k, pos, pos, mask, 1.0)[0, 0].double()
    at = {d: rot(q0, d) @ rot(k0, 0) for d in range(T)}  # the logit of q0, k0 at relative position d
    far = [rerope[i, j] for i in range(T) for j in range(i + 1) if i - j >= w]
    assert len(far) > 50 and all(abs(x - at[w]) < 1e-5 for x in far)  # clipped: distance w, whatever i - j
    for i in range(T):
        for j in range(i + 1):
            d = i - j
            if d < w:  # within the window both are exact rope
                assert abs(rerope[i, j] - at[d]) < 1e-5 and abs(leaky[i, j] - at[d]) < 1e-5
            else:
                assert abs(leaky[i, j] - rot(q0, w + (d - w) / slope) @ rot(k0, 0)) < 1e-5, (i, j)
    # the logit does change with distance below w (so the clip is what makes it constant)
    assert max(at[d] for d in range(w)) - min(at[d] for d in range(w)) > 1e-2
    assert abs(leaky[T - 1, 0] - leaky[w + 4, 0]) > 1e-3  # leaky keeps moving beyond w


def authors_inequalities(L, N, G, W, share=Fraction(2, 3)):
    """The LongLM README's two rules (commit cdbbb06, lines 96 and 110), written out: every position fits, and
    the farthest grouped one is among the well-trained share of L."""
    return (L - W) * G + W >= N and Fraction(W) + Fraction(N - W, G) < share * L


@pytest.mark.parametrize("L", [8, 17, 28, 32, 64, 128, 512, 4096])
def test_selfextend_default_pair_meets_the_authors_inequalities_widest_window_first(L):
    low, high = max(1, math.ceil(L / 8)), min(L - 1, math.floor(3 * L / 8))
    for N in sorted({L + 1, 3 * L // 2, 2 * L, 4 * L, 8 * L, 16 * L, 7 * L + 3}):
        G, W = rope_fixes.selfextend_defaults(L, N)
        assert authors_inequalities(L, N, G, W), (L, N, G, W)
        assert low <= W <= max(low, high) and 2 <= G <= 64, (L, N, G, W)
        # no wider window in the authors' range meets both with a group in theirs, and no smaller group with this W
        assert not any(authors_inequalities(L, N, g, w) for w in range(W + 1, high + 1) for g in range(2, 65))
        assert not any(authors_inequalities(L, N, g, W) for g in range(2, G))
        enc = build("rope-selfextend", train_len=L)
        enc.set_eval_length(N)
        assert (enc.group, enc.neighbor_window) == (G, W)


def test_selfextend_default_pair_at_the_task_and_the_authors_lengths():
    assert rope_fixes.selfextend_defaults(28, 76) == (8, 10)  # the needle's 4x: train length 28 tokens, 76 read
    assert rope_fixes.selfextend_defaults(28, 44) == (4, 10)
    assert rope_fixes.selfextend_defaults(4096, 16384) == (13, 1536)  # Llama 2 at 4x: W in 512 .. 1536, G in 2 .. 64
    G, W = rope_fixes.selfextend_defaults(28, 28 * 40)  # past about 35 L: no pair in range; the smallest W
    assert W == 4 and G > 64 and authors_inequalities(28, 28 * 40, G, W)


def test_selfextend_configured_group_or_window_takes_the_rule_for_the_other():
    fixed_w = build("rope-selfextend", train_len=28, neighbor_window=7)
    fixed_w.set_eval_length(76)
    assert (fixed_w.group, fixed_w.neighbor_window) == (6, 7)  # 7 + 69 / 6 < 18.67; 7 + 69 / 5 is not
    assert authors_inequalities(28, 76, 6, 7) and not authors_inequalities(28, 76, 5, 7)
    wide = build("rope-selfextend", train_len=28, neighbor_window=20)  # W >= 2L/3: only the fitting rule is left
    wide.set_eval_length(76)
    assert wide.group == rope_fixes.fitting_group(28, 76, 20) == 7
    fixed_g = build("rope-selfextend", train_len=28, group=16)
    fixed_g.set_eval_length(76)
    assert fixed_g.group == 16 and fixed_g.neighbor_window == 10  # the widest up to 3L/8 that meets both
    both = build("rope-selfextend", train_len=28, group=3, neighbor_window=5)
    both.set_eval_length(76)
    assert (both.group, both.neighbor_window) == (3, 5)


def test_selfextend_grid_starts_at_the_default_and_holds_distinct_pairs_that_fit():
    cls = encodings.get_class("rope-selfextend")
    assert cls.tuning_grid(28, 28, {}) == [] and cls.tuning_grid(28, 20, {}) == []  # plain rope there
    grid = cls.tuning_grid(28, 76, {})
    assert grid[0] == {"group": 8, "neighbor_window": 10} and grid[1] == {"group": 16, "neighbor_window": 10}
    pairs = [(p["group"], p["neighbor_window"]) for p in grid]
    assert len(set(pairs)) == len(pairs) >= 6
    assert all((28 - W) * G + W >= 76 for G, W in pairs)  # every point fits the length
    assert (4, 7) in pairs  # the row's former default (W = L/4, the smallest G that fits), for valid to judge
    for p in grid:
        build("rope-selfextend", train_len=28, **p)  # every point is a valid option set


def test_rerope_and_leaky_grids_start_at_the_authors_values():
    assert encodings.get_class("rope-rerope").tuning_grid(28, 76, {}) == [{"window": w} for w in (3, 7, 14, 21)]
    leaky = encodings.get_class("rope-leaky").tuning_grid(28, 76, {})
    assert leaky[0] == {"window": 3, "slope": 16.0}
    for p in leaky:
        w, k = p["window"], p["slope"]
        assert k == 16.0 or w + (76 - 1 - w) / k <= 28 - 1 < w + (76 - 1 - w) / (k - 0.1), p  # the smallest fitting k
        build("rope-leaky", train_len=28, **p)
    assert all(p["slope"] == 16.0 for p in encodings.get_class("rope-leaky").tuning_grid(28, 28, {}))


def test_defaults_are_the_authors_ratios():
    # ReRoPE and Leaky ReRoPE: w = 512 of 4096 in the author's code, an eighth of the train length
    assert build("rope-rerope", train_len=4096).window == 512
    assert build("rope-rerope", train_len=32).window == 4
    assert build("rope-rerope", train_len=4).window == 1  # never 0
    leaky = build("rope-leaky", train_len=32)
    assert leaky.window == 4 and leaky.slope == 16.0
    se = build("rope-selfextend", train_len=32)
    assert (se.group, se.neighbor_window) == rope_fixes.selfextend_defaults(32, 32)  # until set_eval_length
    for name in ("rope-rerope", "rope-leaky", "rope-selfextend"):
        assert encodings.get_class(name).trained_as == "rope", name


def test_the_former_default_window_is_an_option_value():
    old = build("rope-rerope", train_len=32, window=16)  # half the train length, the default before
    assert old.window == 16 and old.active_from() == 16
    assert build("rope-leaky", train_len=32, window=16).window == 16


@pytest.mark.parametrize("name", ["rope-rerope", "rope-leaky"])
def test_the_default_window_rule_is_part_of_the_eval_options(name):
    """Eval-only rows: the trained rope weights are the same (no key_options), but numbers made with the
    former default window must not be reused, so the default's rule goes into the eval key."""
    cls = encodings.get_class(name)
    assert cls.key_options(32, {}) == {}
    assert cls.eval_options({}) == {"default_window": "train length / 8"}
    assert cls.eval_options({"window": 0}) == cls.eval_options({})
    assert cls.eval_options({"window": 16}) == {}  # an explicit window is in the row's own options already
    se = encodings.get_class("rope-selfextend")  # its default pair's rule changed: numbers of the former not reused
    assert "LongLM README" in se.eval_options({})["default_pair"]
    assert se.eval_options({"group": 4}) == se.eval_options({})  # one of the two from the rule still
    assert se.eval_options({"group": 4, "neighbor_window": 7}) == {}


def _models(row, cfg, train_len=32):
    torch.manual_seed(0)
    rope = DecoderLM(cfg, "rope", train_len, seed=0).eval()
    with torch.no_grad():  # q . k of order 1, so that positions matter to the outputs
        for b in rope.blocks:
            b.attn.qkv.weight.mul_(8)
    fixed = DecoderLM(cfg, row, train_len, seed=0).eval()
    fixed.load_state_dict(rope.state_dict())
    return rope, fixed


@pytest.mark.parametrize("row,same_up_to,differs_at", [("rope-rerope", 4, 32), ("rope-leaky", 4, 32),
                                                       ("rope-selfextend", 32, 48)])
def test_plain_rope_bitwise_at_and_below_the_activation_length(row, same_up_to, differs_at):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)  # train length 32: ReRoPE's w = 4, Self-Extend's L = 32
    rope, fixed = _models(row, cfg)
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for T in sorted({1, min(7, same_up_to), same_up_to // 2, same_up_to}):
            rope.encoding.set_eval_length(T)
            fixed.encoding.set_eval_length(T)
            assert not fixed.encoding.has_attention_logits, T
            assert torch.equal(rope(x[:, :T]), fixed(x[:, :T])), (row, T)
        for T in (same_up_to + 1, differs_at):
            fixed.encoding.set_eval_length(T)
            assert fixed.encoding.has_attention_logits, T
        rope.encoding.set_eval_length(differs_at)
        fixed.encoding.set_eval_length(differs_at)
        diff = (rope(x[:, :differs_at]) - fixed(x[:, :differs_at])).abs().max()
        assert diff > 1e-3, (row, diff)


def reference_forward(model, idx, positions):
    """The model's forward (transformer.py: pre-LN blocks, tied head) in float64 with attention written out
    pair by pair: query i attends keys j <= i, logit (R(pq) q_i) . (R(pk) k_j) / sqrt(D), (pq, pk) = positions(i, j)."""
    m = copy.deepcopy(model).double()
    B, T = idx.shape
    H = m.cfg.n_heads
    C = m.cfg.d_model
    D = C // H
    x = m.tok_emb(idx)
    for block in m.blocks:
        h = block.ln1(x)
        q, k, v = block.attn.qkv(h).split(C, dim=2)
        y = torch.zeros(B, T, C, dtype=torch.float64)
        for b in range(B):
            for hd in range(H):
                sl = slice(hd * D, (hd + 1) * D)
                logits = reference_logits(q[b, :, sl], k[b, :, sl], positions, 1 / math.sqrt(D))
                y[b, :, sl] = torch.softmax(logits, -1) @ v[b, :, sl]
        x = x + block.attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return m.lm_head(m.ln_f(x))


WHOLE = [
    ("rope-rerope", {}, lambda i, j: rerope_positions(i, j, 4)),  # the default w: train length 32 / 8
    ("rope-rerope", {"window": 6}, lambda i, j: rerope_positions(i, j, 6)),
    ("rope-leaky", {"window": 8, "slope": 3.0}, lambda i, j: leaky_positions(i, j, 8, 3.0)),
    # T = 48, L = 32: the authors' rules give W = 12 (3L/8) and G = 4 (12 + 36 / 4 < 2/3 x 32; 12 + 36 / 3 is not)
    ("rope-selfextend", {}, lambda i, j: selfextend_positions(i, j, 4, 12)),
    ("rope-selfextend", {"neighbor_window": 5, "group": 3}, lambda i, j: selfextend_positions(i, j, 3, 5)),
]


@pytest.mark.parametrize("row,options,positions", WHOLE, ids=[f"{n}-{o}" for n, o, _ in WHOLE])
def test_whole_model_beyond_the_activation_length_equals_the_pairwise_reference(row, options, positions):
    T = 48
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, encoding_options={row: options} if options else {})
    rope, fixed = _models(row, cfg)
    # small chunks too: a query chunk's positions must be taken from where it starts
    chunked = DecoderLM(cfg, row, 32, seed=0, max_mask_bytes=4 * 2 * T * 8 * 5).eval()
    chunked.load_state_dict(rope.state_dict())
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = reference_forward(fixed, idx, positions)
        for model in (fixed, chunked):
            model.encoding.set_eval_length(T)
            got = model(idx).double()
            err = (got - want).abs().max()
            assert err < 1e-4, (row, options, err)
        rope.encoding.set_eval_length(T)
        assert (rope(idx).double() - want).abs().max() > 1e-3  # the reference tells the rule from plain rope
    from posenc_bench.model.plan import AttentionPlan

    assert len(AttentionPlan(chunked.encoding, torch.arange(T), None, chunked.max_mask_bytes).chunks) > 1


@pytest.mark.parametrize("name,options,value", [
    ("rope-rerope", {"window": -3}, "-3"),
    ("rope-rerope", {"window": 33}, "33"),
    ("rope-leaky", {"window": 40}, "40"),
    ("rope-leaky", {"slope": 1.0}, "1.0"),
    ("rope-leaky", {"slope": 0.5}, "0.5"),
    ("rope-selfextend", {"neighbor_window": 32}, "32"),
    ("rope-selfextend", {"neighbor_window": -1}, "-1"),
    ("rope-selfextend", {"group": -2}, "-2"),
])
def test_bad_options_raise_naming_the_value(name, options, value):
    with pytest.raises(ValueError, match=value):
        encodings.build(name, d_model=32, n_heads=2, train_len=32, options=options)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, encoding_options={name: options})
    with pytest.raises(ConfigError, match=value):
        DecoderLM(cfg, name, 32)


def test_unknown_option_is_a_config_error_listing_the_valid_ones():
    with pytest.raises(ConfigError, match="window"):
        encodings.build("rope-rerope", d_model=32, n_heads=2, train_len=32, options={"w": 4})
    with pytest.raises(ConfigError, match="neighbor_window"):
        encodings.build("rope-selfextend", d_model=32, n_heads=2, train_len=32, options={"window": 4})
