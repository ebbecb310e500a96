"""Which SDPA path an attention bias takes: the model passes a 4-D (1, H, L, L) mask; a 3-D (H, L, L) mask
with the same values sends torch's CPU SDPA to its slow math path. Compare against the fused causal path.

pytest benchmarks/test_sdpa_mask_layout.py --benchmark-only
"""

import pytest
import torch
import torch.nn.functional as F

from posenc_bench.encodings.alibi import ALiBi

B, H, L, D = 8, 4, 512, 32


@pytest.fixture(scope="module")
def qkv_and_masks():
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    pos = torch.arange(L)
    mask4 = ALiBi(d_model=H * D, n_heads=H, train_len=L).bias(pos, pos)
    mask4 = mask4.masked_fill(pos[None, :] > pos[:, None], float("-inf"))  # (1, H, L, L)
    return q, k, v, mask4


@pytest.mark.parametrize("layout", ["fused causal", "4-D mask", "3-D mask"])
def test_sdpa_forward_backward(benchmark, qkv_and_masks, layout):
    benchmark.group = f"SDPA forward+backward, B={B} H={H} L={L} D={D}"
    torch.set_num_threads(2)
    q, k, v, mask4 = qkv_and_masks
    kwargs = {"fused causal": {"is_causal": True}, "4-D mask": {"attn_mask": mask4}, "3-D mask": {"attn_mask": mask4[0]}}[layout]

    def step():
        y = F.scaled_dot_product_attention(q, k, v, **kwargs)
        y.sum().backward()
        return y

    y = benchmark(step)
    if layout != "fused causal":  # the mask layouts give the same values
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask4)
        assert torch.allclose(y, ref, atol=1e-5)
