"""A learned distance bias's training path: the flash kernel plus the band gradient equal autograd through the
whole (H, Tq, Tk) bias, in the output and in the gradients of q, k, v and the bias table r, for any query block
size and any chunk offset (queries from q_start, keys from k_start)."""

import pytest
import torch

from posenc_bench.model import distance_bias

pytestmark = pytest.mark.skipif(not distance_bias.supported(torch.zeros(1)), reason="no CPU flash kernel in this torch")


@pytest.mark.parametrize("rows", [1, 5, 64])  # query blocks of the band gradient
@pytest.mark.parametrize("q_start,k_start", [(0, 0), (24, 10), (30, 27)])  # a chunk, its keys cut by a window
def test_band_gradient_equals_autograd_through_the_whole_bias(rows, q_start, k_start):
    B, H, D, W, Tq = 2, 3, 8, 6, 20
    Tk = q_start + Tq - k_start  # keys [k_start, q_start + Tq)
    g = torch.Generator().manual_seed(rows + q_start)
    q, k, v = (torch.randn(B, H, n, D, generator=g, requires_grad=True) for n in (Tq, Tk, Tk))
    r = torch.randn(H, W + 1, generator=g, requires_grad=True)
    i = torch.arange(q_start, q_start + Tq)[:, None]
    j = torch.arange(k_start, q_start + Tq)[None, :]
    visible = (j <= i) & (j > i - 8)  # causal, a window of 8 keys
    mask = r[:, (i - j).clamp(0, W)].masked_fill(~visible, float("-inf"))[None]  # (1, H, Tq, Tk)
    scale = D ** -0.5
    want = torch.softmax((q @ k.transpose(-1, -2)) * scale + mask, dim=-1) @ v
    got = distance_bias.distance_bias_attention(q, k, v, r, mask, scale, q_start, k_start, rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn(want.shape, generator=g)
    grads_want = torch.autograd.grad(want, (q, k, v, r), grad_out)
    grads_got = torch.autograd.grad(got, (q, k, v, r), grad_out)
    for name, a, b in zip("qkvr", grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert grads_got[3][:, W].abs().sum() > 0  # the shared tail bucket gets its gradient (row-sum identity)
