"""STRING (An et al. 2024) against its position matrix written out from the authors' rule: a pair at distance
d = i - j is rotated by d below the shift S and by d - S + W from S on (string_for_llama.py at HKUNLP/STRING
216cc2f: near keys exact, q at i - S + W for the far ones), every logit times (0.1 ln 2 + 1)^2 where it shifts
anything; the whole model, chunk by chunk, at 1x to 4x the train length; plain rope wherever no distance
reaches S; the positions it uses; its grid."""

import copy
import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import DecoderLM, ModelConfig

from tests.encodings.test_rope_fixes import rot

L = 24  # train length of these tests' models
FACTOR = 0.1 * math.log(2) + 1  # the authors' attention_factor (replace_with_string, line 739)


def string_matrix(q_pos, k_pos, S, W):
    """The authors' relative position of every pair (q, k), int64: i - j below S, else i - j - S + W (future
    pairs get their negative distance; the mask hides them)."""
    d = q_pos[:, None] - k_pos[None, :]
    return torch.where(d < S, d, d - S + W)


class ExplicitString(encodings.Encoding):
    """The reference: every pair's logit (R(P_ij) q_i) . k_j in float64 from the explicit matrix P, times the
    factor squared (the authors scale cos and sin, so both rotations) where a window is longer than S."""

    has_attention_logits = True

    def __init__(self, *, d_model, n_heads, train_len, shift, local_window, factor):
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        self.S, self.W, self.factor, self.gain = shift, local_window, factor, 1.0

    def set_eval_length(self, length):
        self.gain = self.factor ** 2 if length > self.S else 1.0

    def attention_logits(self, q, k, q_pos, k_pos, mask, scale):
        P = string_matrix(q_pos, k_pos, self.S, self.W)  # (q, k)
        rotated = rot(q.double()[:, :, :, None, :], P)  # (B, H, q, k, D): each query turned by each pair's P
        logits = (rotated * k.double()[:, :, None, :, :]).sum(-1) * scale * self.gain  # (B, H, q, k)
        return logits.float() + mask


def models(T, chunk_rows, **options):
    """(ours, the reference, plain rope) at eval length T: one tiny model's weights (seed 0), q and k scaled up
    so attention is sharp enough for positions to matter; ours with ``chunk_rows`` queries per chunk."""
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, encoding_options={"rope-string": options})
    budget = 4 * AttentionPlan.PART_TENSORS * T * chunk_rows  # parts chunks of chunk_rows queries
    ours = DecoderLM(cfg, "rope-string", L, max_mask_bytes=budget, seed=0).eval()
    with torch.no_grad():
        for block in ours.blocks:
            block.attn.qkv.weight[:64].mul_(12.0)  # q and k rows of the (3C, C) projection
    plain = copy.deepcopy(ours)
    plain.encoding = encodings.build("rope", d_model=32, n_heads=2, train_len=L)
    reference = copy.deepcopy(ours)
    enc = ours.encoding
    reference.encoding = ExplicitString(d_model=32, n_heads=2, train_len=L, shift=enc.shift,
                                        local_window=enc.local_window, factor=enc.attention_factor)
    for model in (ours, reference, plain):
        model.encoding.set_eval_length(T)
    return ours, reference, plain


@pytest.mark.parametrize("options", [{"shift": 9, "local_window": 3}, {}, {"shift": 13, "local_window": 5,
                                                                            "attention_factor": 1.0}])
@pytest.mark.parametrize("T", [L, 36, 2 * L, 4 * L])
@pytest.mark.parametrize("chunk_rows", [2, 7, 1 << 20])  # below W and S; not aligned with them; one chunk
def test_the_model_equals_attention_with_the_explicit_string_matrix(options, T, chunk_rows):
    ours, reference, plain = models(T, chunk_rows, **options)
    enc = ours.encoding
    plan = AttentionPlan(enc, torch.arange(T), None, ours.max_mask_bytes)
    assert plan.path == "parts" and max(qe - qs for qs, qe, _ in plan.chunks) == min(T, chunk_rows)  # 2 < W, S
    x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        got, want, rope = ours(x), reference(x), plain(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - rope).abs().max() > 1e-2  # the shift (and factor) change the model: the check can fail


@pytest.mark.parametrize("options,lengths", [({}, range(2, 8)), ({"shift": 4 * L}, (L, 36, 2 * L, 4 * L)),
                                             ({"shift": 9, "local_window": 3}, (5, 9))])
def test_plain_rope_bitwise_wherever_no_distance_reaches_the_shift(options, lengths):
    for T in lengths:
        ours, _, plain = models(T, 1 << 20, **options)
        assert T <= ours.encoding.shift and not ours.encoding.has_attention_logits
        x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert torch.equal(ours(x), plain(x)), T
    T = ours.encoding.shift + 1  # one pair at distance S: STRING (and its factor) from there on
    ours, _, plain = models(T, 1 << 20, **options)
    x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.equal(ours(x), plain(x))


def positions_used(enc, T, chunk_rows):
    """Run ``enc.attention_parts`` over the chunks of a window of T tokens and read back, from the positions it
    rotates q and k by, the relative position every pair of each part is given: {(i, j): [positions]}."""
    calls = []
    rotated = enc.rotated
    enc.rotated = lambda x, pos: calls.append(pos) or rotated(x, pos)
    plan = AttentionPlan(enc, torch.arange(T), None, 4 * AttentionPlan.PART_TENSORS * T * chunk_rows)
    q = torch.randn(1, enc.n_heads, T, enc.head_dim)
    used = {}
    for i, (qs, qe, ks) in enumerate(plan.chunks):
        q_pos, k_pos = plan.chunk_positions(i)
        calls.clear()
        parts = enc.attention_parts(q[:, :, qs:qe], q[:, :, ks:qe], q_pos, k_pos)
        assert len(calls) == 2 * len(parts)  # q, then k, rotated once per part
        for p, (_, _, first, pairs) in enumerate(parts):
            rel = calls[2 * p][:, None] - calls[2 * p + 1][None, :]  # (q, n) q's position minus k's
            for a, c in pairs.nonzero().tolist():
                if q_pos[a] >= k_pos[first + c]:  # a visible pair (the chunk's mask hides the others)
                    used.setdefault((int(q_pos[a]), int(k_pos[first + c])), []).append(int(rel[a, c]))
    return used


@pytest.mark.parametrize("options", [{}, {"shift": 9, "local_window": 3}, {"shift": 30, "local_window": 8}])
@pytest.mark.parametrize("T", [L, 36, 2 * L, 4 * L])
def test_each_pair_once_at_the_authors_position_and_below_the_train_length_while_it_can_be(options, T):
    enc = encodings.build("rope-string", d_model=32, n_heads=2, train_len=L, options=options)
    enc.set_eval_length(T)
    S, W = enc.shift, enc.local_window
    used = positions_used(enc, T, chunk_rows=5)
    assert sorted(used) == [(i, j) for i in range(T) for j in range(i + 1)]  # every causal pair, in one part
    P = string_matrix(torch.arange(T), torch.arange(T), S, W)
    assert all(v == [int(P[i, j])] for (i, j), v in used.items())
    largest = max(v[0] for v in used.values())
    assert largest == max(min(T - 1, S - 1), T - 1 - S + W if T > S else 0)
    assert min(v[0] for v in used.values()) == 0
    # every position below the train length exactly while T - 1 - S + W < L and the near band min(T, S) fits:
    # at 1x with the authors' S (up to L + S - W); past that the shift, S - W, cannot hold the farthest pairs
    assert (largest < L) == (T <= L + S - W and min(T, S) <= L), (T, S, W)
    assert largest < L or T > L


def test_defaults_are_the_authors_and_options_are_checked():
    cls = encodings.get_class("rope-string")
    assert cls.trained_as == "rope" and cls.family == "rotary fix (zero-shot)"
    for train_len, S, W in ((131072, 43253, 128), (4096, 1351, 128), (2048, 675, 128), (512, 168, 32), (128, 42, 8),
                            (16, 5, 1), (4, 2, 1)):
        enc = encodings.build("rope-string", d_model=32, n_heads=2, train_len=train_len)
        assert (enc.shift, enc.local_window) == (S, W), train_len  # 43253: the README's 131072 * 0.33 (line 55)
        assert enc.shift == max(2, int(0.33 * train_len)) and enc.attention_factor == FACTOR
    for bad, named in (({"shift": -1}, "shift=-1"), ({"local_window": 9, "shift": 9}, "W=9"),
                       ({"attention_factor": 0.0}, "got 0.0")):
        with pytest.raises(ValueError, match=named):
            encodings.build("rope-string", d_model=32, n_heads=2, train_len=L, options=bad)


def test_the_factor_scales_logits_only_where_the_row_shifts():
    enc = encodings.build("rope-string", d_model=32, n_heads=2, train_len=L)
    assert enc.attention_scale == 1.0
    enc.set_eval_length(enc.shift + 1)
    assert enc.attention_scale == FACTOR and enc.has_attention_logits
    enc.set_eval_length(enc.shift)
    assert enc.attention_scale == 1.0 and not enc.has_attention_logits
    cos, _ = enc.cos_sin(torch.arange(3), torch.float32)
    assert torch.equal(cos[0], torch.ones_like(cos[0]))  # the cache was rebuilt at scale 1


def test_grid_starts_at_the_authors_default_then_their_sweeps():
    cls = encodings.get_class("rope-string")
    for train_len, N in ((131072, 131072), (128, 128), (128, 512), (512, 1024)):
        grid = cls.tuning_grid(train_len, N, {})
        enc = encodings.build("rope-string", d_model=32, n_heads=2, train_len=train_len)
        assert grid[0] == {"shift": enc.shift, "local_window": enc.local_window, "attention_factor": FACTOR}
        assert grid[1] == {**grid[0], "attention_factor": 1.0}  # the position rule alone
        assert len({tuple(p.values()) for p in grid}) == len(grid)
        for p in grid:
            assert p["local_window"] < p["shift"]
            encodings.build("rope-string", d_model=32, n_heads=2, train_len=train_len, options=p)
    shifts = {p["shift"] for p in cls.tuning_grid(131072, 131072, {})}
    assert shifts == {43253, 32768, 52428, 65536}  # 0.33, the README's 0.25 and 0.4, niah's 0.5
    windows = {p["local_window"] for p in cls.tuning_grid(131072, 131072, {})}
    assert windows == {128, 256, 512}  # the README's 128, 256, 512
    grid = cls.tuning_grid(128, 192, {})  # 1.5x: the eval length's share, and the smallest S within L
    assert {"shift": 63, "local_window": 8, "attention_factor": FACTOR} in grid
    ours = {"shift": 72, "local_window": 8, "attention_factor": FACTOR}
    assert ours in grid and 192 - 1 - 72 + 8 == 128 - 1  # the farthest pair exactly at L - 1
    assert not any(p["shift"] == 256 - 128 + 8 for p in cls.tuning_grid(128, 256, {}))  # past L: no such S
    assert cls.tuning_grid(128, 20, {}) == []  # no point shifts anything in a window of 20 tokens
    active = [p for p in cls.tuning_grid(128, 30, {}) if p["shift"] < 30]
    assert active == [{"shift": 9, "local_window": 8, "attention_factor": FACTOR}]  # int(0.33 * 30), the scripts'
    held = cls.tuning_grid(128, 512, {"shift": 50, "attention_factor": 1.0})
    assert all(p["shift"] == 50 and p["attention_factor"] == 1.0 for p in held) and len(held) == 3  # W 8, 16, 32
