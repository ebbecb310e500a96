"""FIRE: b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), entry by entry; the authors' defaults,
and the whole bias against the reference code in float64."""

import copy
import math

import pytest
import torch
from torch.testing import assert_close

from posenc_bench import encodings, native
from posenc_bench.encodings import fire as fire_module
from posenc_bench.encodings import fire_kernel


def build(**options):
    torch.manual_seed(0)
    return encodings.build("fire", d_model=16, n_heads=2, train_len=64, options=options)


class ReferenceFIRE(torch.nn.Module):
    """The reference, transcribed from mcleish7/arithmetic, cramming/architectures/embeddings.py, class FIRE
    (lines 419-480, commit 86022a5). One change: ``dtype`` replaces the ``torch.float`` of line 464 (float32
    positions would keep c * distances in float32: a 0-dim float64 c does not promote them)."""

    def __init__(self, num_heads=12, mlp_width=32, init_c=0.1, init_L=512.0, eps=1e-6, max_length=0,
                 dtype=torch.float):
        super().__init__()
        self.max_length = max_length  # using random PE
        self.dtype = dtype
        self.mlp = torch.nn.Sequential(torch.nn.Linear(1, mlp_width), torch.nn.ReLU(), torch.nn.Linear(mlp_width, num_heads))
        self.c = torch.nn.Parameter(torch.tensor(init_c))
        self.init_L = torch.nn.Parameter(torch.tensor(init_L), requires_grad=False)
        self.L_multiplier = torch.nn.Parameter(torch.tensor(1.0))  # learn a multiplier to L
        self.eps = eps

    def forward(self, seq_length, device):
        if (seq_length > self.max_length) or (not self.training):
            max_length = seq_length
        else:
            max_length = self.max_length
        positions = torch.sort(torch.randperm(max_length, dtype=self.dtype, device=device)[:seq_length]).values
        relative_distances = positions[:, None] - positions[None, :]
        threshold = torch.abs(self.L_multiplier * self.init_L)
        position_normalizer = torch.max(positions, threshold)[:, None]
        relative_distances = torch.log(torch.abs(self.c * relative_distances) + 1)
        position_normalizer = torch.log(torch.abs(self.c * position_normalizer) + 1)
        normalized_distances = relative_distances / (position_normalizer + self.eps)
        fire_bias = self.mlp(normalized_distances.unsqueeze(-1)).unsqueeze(0)
        fire_bias = fire_bias.permute(0, 3, 1, 2)
        return fire_bias


def twin(enc, max_length=0):
    """The reference in float64 with ``enc``'s parameters (``enc`` is moved to float64 too)."""
    enc.double()
    ref = ReferenceFIRE(num_heads=enc.mlp[2].out_features, mlp_width=enc.mlp[0].out_features,
                        max_length=max_length, dtype=torch.float64).double()
    ref.mlp.load_state_dict(enc.mlp.state_dict())
    with torch.no_grad():
        ref.c.copy_(enc.c), ref.init_L.copy_(enc.threshold_init), ref.L_multiplier.copy_(enc.threshold_multiplier)
    return ref


def reference_bias(ref, seq_length, seed):
    """The reference's bias and the positions it drew (its randperm replayed from the same seed)."""
    torch.manual_seed(seed)
    bias = ref(seq_length, "cpu")
    torch.manual_seed(seed)
    max_length = ref.max_length if ref.training and seq_length <= ref.max_length else seq_length
    positions = torch.sort(torch.randperm(max_length, dtype=torch.float64)[:seq_length]).values
    return bias, positions.long()


TIGHT = dict(rtol=1e-12, atol=1e-13)


def test_defaults_are_the_reference_codes():
    """embeddings.py line 420: mlp_width=32, init_c=0.1, init_L=512.0, eps=1e-6; L_multiplier 1 (line 442)."""
    from posenc_bench.encodings import fire

    enc = build()
    ref = ReferenceFIRE(num_heads=2)
    assert enc.mlp[0].out_features == ref.mlp[0].out_features == 32
    assert isinstance(enc.mlp[1], torch.nn.ReLU) and len(enc.mlp) == 3
    assert enc.c.item() == ref.c.item() and enc.c.requires_grad  # 0.1 in float32, learned
    assert enc.threshold_init.item() == ref.init_L.item() == 512.0 and not enc.threshold_init.requires_grad
    assert enc.threshold_multiplier.item() == ref.L_multiplier.item() == 1.0 and enc.threshold_multiplier.requires_grad
    assert enc.threshold().item() == 512.0  # a number of tokens, whatever the train length
    assert fire.EPS == ref.eps == 1e-6
    assert build(threshold=100.0).threshold().item() == 100.0
    assert build(threshold=0).threshold().item() == 16.0  # the earlier default: train length / 4


@pytest.mark.parametrize("length", [5, 64, 200])
def test_bias_equals_the_reference_code_on_the_arange_in_float64(length):
    """Defaults, positions 0 .. T-1 (the reference in eval mode): every (h, i, j), future keys included."""
    enc = build()
    with torch.no_grad():  # trained-looking weights
        for p in enc.mlp.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ref = twin(enc).eval()
    want, pos = reference_bias(ref, length, seed=0)
    assert torch.equal(pos, torch.arange(length))
    got = enc.bias(pos, pos)
    assert got.dtype == torch.float64 and got.shape == want.shape == (1, 2, length, length)
    assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("c, threshold, multiplier", [(0.3, 10.0, 1.0), (-0.2, 40.0, -1.7), (0.05, 512.0, 0.25)])
def test_bias_equals_the_reference_code_at_non_default_c_and_L_past_the_train_length(c, threshold, multiplier):
    """Sorted random positions up to 3000 (the reference's own randomised mode, training with max_length), far
    past the train length (64) and past L; a negative c and a negative multiplier (both enter through |.|)."""
    enc = build(threshold=threshold, c_init=0.3)
    with torch.no_grad():
        enc.c.fill_(c), enc.threshold_multiplier.fill_(multiplier)
    ref = twin(enc, max_length=3000).train()
    for seed in (1, 2):
        want, pos = reference_bias(ref, 150, seed)
        assert pos.max() > 512 and pos.max() > enc.threshold().item()
        assert_close(enc.bias(pos, pos), want, **TIGHT)
        assert_close(enc.bias(pos[100:], pos), want[:, :, 100:], **TIGHT)  # a block of query rows


def test_batched_positions_equal_the_reference_per_sequence_in_float64():
    enc = build(threshold=30.0)
    ref = twin(enc, max_length=1000).train()
    (want0, pos0), (want1, pos1) = reference_bias(ref, 40, 3), reference_bias(ref, 40, 4)
    got = enc.bias(torch.stack([pos0, pos1]), torch.stack([pos0, pos1]))
    assert got.shape == (2, 2, 40, 40)
    assert_close(got, torch.cat([want0, want1]), **TIGHT)


def mlp_by_hand(enc, u):
    """f_theta(u) for a scalar u: Linear(1, width) -> ReLU -> Linear(width, H), written out."""
    w1, b1 = enc.mlp[0].weight[:, 0].tolist(), enc.mlp[0].bias.tolist()
    w2, b2 = enc.mlp[2].weight.tolist(), enc.mlp[2].bias.tolist()
    hidden = [max(0.0, a * u + b) for a, b in zip(w1, b1)]
    return [sum(w * x for w, x in zip(row, hidden)) + b for row, b in zip(w2, b2)]


def test_bias_is_the_papers_formula_entry_by_entry():
    enc = build(threshold=10.0, c_init=0.3)
    pos = torch.arange(200)  # past the train length: i > L normalises by psi(i)
    b = enc.bias(pos[150:], pos)[0]  # (H, 50, 200)
    psi = lambda x: math.log(0.3 * x + 1)  # noqa: E731
    for i in (150, 151, 199):
        for j in (0, 7, 120, i):
            want = mlp_by_hand(enc, psi(i - j) / (psi(max(10.0, i)) + 1e-6))
            for h in range(2):
                assert b[h, i - 150, j].item() == pytest.approx(want[h], rel=1e-4, abs=1e-5), (i, j, h)
    small = enc.bias(torch.arange(5), torch.arange(5))[0]  # i < L: normalised by psi(L)
    want = mlp_by_hand(enc, psi(3) / (psi(10.0) + 1e-6))
    assert small[:, 4, 1].tolist() == pytest.approx(want, rel=1e-4)


def test_normalised_distance_stays_in_unit_interval_at_any_length():
    enc = build()
    pos = torch.arange(2000)
    u = enc.normalized_distance(pos[-8:], pos)
    assert u.min() >= 0 and u.max() <= 1
    assert enc.normalized_distance(pos[:3], pos[:3])[0, 2] > 0  # a future key: psi(|i - j|), as the reference


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_mlp_as_lines_equals_the_mlp_and_its_gradients(seed, kernel, monkeypatch):
    """bias() evaluates the MLP as one line per piece between its kinks: equal to running the MLP on every pair
    (float32, 1e-5) in value, and in the gradient of every parameter (c and L included) as close to the MLP's
    in float64 as float32 allows (1e-5 of each gradient's scale: a gradient sums 90,000 pairs); units with
    W1 = 0 (no kink) included. Both in the C kernels (``fire_kernel``, float32 on the CPU) and in torch ops."""
    if kernel and fire_kernel.library() is None:
        pytest.skip(native.why_not("fire", fire_kernel.SOURCE))
    if not kernel:
        monkeypatch.setattr(fire_kernel, "usable", lambda u, piece: False)
    torch.manual_seed(seed)
    enc = build()
    with torch.no_grad():
        enc.mlp[0].weight[:3] = 0  # constant units
        enc.c.fill_(0.3 + seed)
    pos = torch.arange(300)

    def pair_by_pair(e):
        return e.mlp(e.normalized_distance(pos, pos)[..., None]).movedim(-1, 0).unsqueeze(0)  # (1, H, T, T)

    lines = enc.bias(pos, pos)
    torch.testing.assert_close(lines, pair_by_pair(enc), rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation holds u - p_s one block at a time: the same values
        assert torch.equal(enc.bias(pos, pos), lines)
    g = torch.randn(lines.shape, generator=torch.Generator().manual_seed(seed))
    ours = torch.autograd.grad(lines, list(enc.parameters()), g)
    exact = copy.deepcopy(enc).double()
    want = torch.autograd.grad(pair_by_pair(exact), list(exact.parameters()), g.double())
    for a, b in zip(ours, want):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("c,threshold", [(0.1, 512.0), (-0.3, 7.0), (0.05, 3.0)])
def test_normalised_distance_backward_equals_autograd_through_the_definition(dtype, batched, c, threshold):
    """FIRE's _PsiRatio (row sums in backward, u alone held) against autograd through psi_ratio: the same u
    bit for bit, and the same gradients of c and L, with a query exactly at L (torch.maximum's tie: half)."""
    g = torch.Generator().manual_seed(int(threshold))
    draws = [torch.randperm(40, generator=g)[:12].sort().values for _ in range(2 if batched else 1)]
    pos = (torch.stack(draws) if batched else draws[0]).to(dtype)
    i, j = pos[..., :, None].clone(), pos[..., None, :]
    i[..., 3, 0] = threshold  # a tie with the threshold
    c_, L_ = (torch.tensor(x, dtype=dtype, requires_grad=True) for x in (c, threshold))
    grad = torch.randn(torch.broadcast_shapes(i.shape, j.shape), dtype=dtype, generator=g)
    want = fire_module.FIRE.psi_ratio(i, j, c_, L_)
    got = fire_module._PsiRatio.apply(i, j, c_, L_)
    assert torch.equal(got, want)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(torch.autograd.grad(got, (c_, L_), grad), torch.autograd.grad(want, (c_, L_), grad)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(b.abs()))
    assert torch.autograd.grad(fire_module._PsiRatio.apply(i, j, c_, L_).sum(), L_)[0] != 0  # L is read


def test_pieces_count_the_kinks_below_each_value_as_bucketize():
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        kinks = torch.randn(int(torch.randint(0, 40, (), generator=g)), generator=g).sort().values
        u = torch.rand(17, 23, generator=g) * 3 - 0.5
        if len(kinks):
            u[2, 5] = kinks[len(kinks) // 2]  # exactly at a kink: bucketize counts it below (right=False)
        got = fire_module.pieces(u, kinks)
        assert got.dtype == torch.uint8 and torch.equal(got.long(), torch.bucketize(u, kinks)), trial


def test_batched_positions_are_each_sequences_own():
    enc = build()
    batched = torch.tensor([[0, 5, 40, 90], [2, 3, 4, 5]])
    b = enc.bias(batched, batched)
    assert b.shape == (2, 2, 4, 4)
    assert torch.allclose(b[0], enc.bias(batched[0], batched[0])[0])
