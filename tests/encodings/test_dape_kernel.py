"""dape_kernel: the C kernels build where a compiler is found, take float32 CPU tensors only, and equal DAPE's f on
torch ops (``DAPEMLP.forward`` under autograd), values and every gradient, with the bias shared by the batch or
per sequence, with and without its gradient; keys hidden from a whole query row are skipped (f is 0 there and so
are their gradients). The whole attention against the authors' formula on both paths: test_dape.py."""

import pytest
import torch

from posenc_bench import native
from posenc_bench.encodings import dape_kernel
from posenc_bench.encodings.dape import NEGATIVE_SLOPE, DAPEMLP


@pytest.fixture(autouse=True)
def built():
    if dape_kernel.library() is None:
        pytest.skip(native.why_not("dape", dape_kernel.SOURCE))


def test_the_kernels_take_float32_cpu_tensors_only():
    x = torch.zeros(1, 2, 3, 3)
    assert dape_kernel.usable(x, x, torch.zeros(4, 2))
    assert not dape_kernel.usable(x.double(), x, torch.zeros(4, 2))
    assert not dape_kernel.usable(x, x, torch.zeros(4, 2, dtype=torch.float64))


def test_row_limits_are_the_last_key_any_head_sees_plus_one():
    inf = float("-inf")
    mask = torch.tensor([[0, inf, inf, inf], [0, 0, inf, inf], [inf, inf, inf, inf], [inf, 0, inf, 0]])
    assert dape_kernel.row_limits(mask[None, None]).tolist() == [1, 2, 0, 4]
    per_head = torch.stack([mask, mask.roll(1, 0)])[None]  # (1, 2, 4, 4): a row any head sees counts
    assert dape_kernel.row_limits(per_head).tolist() == [4, 2, 2, 4]


@pytest.mark.parametrize("bias_batch", [1, 2])
@pytest.mark.parametrize("bias_grad", [True, False])
def test_f_and_its_gradients_equal_the_torch_ops(bias_batch, bias_grad):
    """A causal chunk of 70 queries at the end of 150 keys (several 64-key blocks and a ragged one), W = 8,
    with gradients from the visible pairs only (as softmax gives them)."""
    g = torch.Generator().manual_seed(3)
    B, H, q, k, W = 2, 3, 70, 150, 8
    torch.manual_seed(3)
    m = DAPEMLP(H, W)
    x = torch.randn(B, H, q, k, generator=g, requires_grad=True)
    b = torch.randn(bias_batch, H, q, k, generator=g, requires_grad=bias_grad)
    mask = torch.full((q, k), float("-inf")).triu(k - q + 1)[None, None]
    weights = m.kernel_args(x, b)
    assert weights is not None
    got = dape_kernel.PairMLP.apply(x, b, dape_kernel.row_limits(mask), *weights, NEGATIVE_SLOPE)
    want = m(x, b)
    seen = torch.isfinite(mask).expand(B, H, q, k)
    torch.testing.assert_close(got[seen], want[seen], rtol=1e-5, atol=1e-5)
    assert (got[~seen] == 0).all()
    grad = torch.randn(B, H, q, k, generator=g) * seen
    inputs = [x, *([b] if bias_grad else []), *m.parameters()]
    for a, r in zip(torch.autograd.grad(got, inputs, grad, retain_graph=True),
                    torch.autograd.grad(want, inputs, grad)):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4 * r.abs().max().item())
    assert torch.autograd.grad(got, [x], grad * ~seen)[0].abs().max() == 0  # hidden pairs give nothing


def test_a_row_no_key_of_which_is_seen_is_all_zero():
    torch.manual_seed(0)
    m = DAPEMLP(2, 4)
    x, b = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 5)
    out = dape_kernel.PairMLP.apply(x, b, torch.tensor([0, 5, 2]), *m.kernel_args(x, b), NEGATIVE_SLOPE)
    assert (out[:, :, 0] == 0).all() and (out[:, :, 2, 2:] == 0).all()
    torch.testing.assert_close(out[:, :, 1], m(x, b)[:, :, 1])
