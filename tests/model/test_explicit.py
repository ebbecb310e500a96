"""The explicit-logits paths: an encoding's logits split into plain attentions over disjoint pairs and merged
by log-sum-exp (parts) equal softmax of the whole logits (logits), on every chunking and kernel."""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model.plan import AttentionPlan, Chunk
from posenc_bench.model.explicit import attention_lse, explicit_attention, parts_attention


def _softmax_of_the_logits(plan, c):
    q_pos, k_pos = plan.chunk_positions(c.i)
    logits = plan.encoding.attention_logits(c.q, c.k, q_pos, k_pos, c.mask, c.scale)
    return torch.softmax(logits.float(), dim=-1) @ c.v


@pytest.mark.parametrize("name", ["rope-rerope", "rope-leaky", "rope-selfextend", "rope-string"])
@pytest.mark.parametrize("max_bytes", [1 << 30, 4 * 64 * 8 * 5])  # one chunk; chunks of 5 queries
@pytest.mark.parametrize("grad", [False, True])  # the CPU flash kernel; the explicit fallback
def test_parts_equal_the_whole_logits(name, max_bytes, grad):
    T, H, D = 64, 2, 8
    enc = encodings.build(name, d_model=H * D, n_heads=H, train_len=16)
    enc.set_eval_length(T)
    assert enc.has_attention_logits and enc.has_attention_parts
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=g) for _ in range(3))
    with torch.set_grad_enabled(grad):
        plan = AttentionPlan(enc, torch.arange(T), None, max_bytes)
        assert plan.path == "parts"
        assert (len(plan.chunks) == 1) == (max_bytes == 1 << 30)
        for i, (qs, qe, ks) in enumerate(plan.chunks):
            c = Chunk(i, q[:, :, qs:qe], k[:, :, ks:qe], v[:, :, ks:qe], plan.mask(i, q.dtype), D ** -0.5)
            got, want = parts_attention(plan, c), _softmax_of_the_logits(plan, c)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(explicit_attention(plan, c), want)  # the logits path: the same attention


def test_lse_of_a_row_with_no_visible_key_is_minus_infinity_on_both_kernels():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    mask = torch.zeros(1, 1, 3, 5)
    mask[..., 0, :] = float("-inf")  # row 0 sees nothing
    mask[..., 2, 1:] = float("-inf")
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out, lse = attention_lse(q, k, v, mask, 0.5)
        logits = (q @ k.transpose(-1, -2)) * 0.5 + mask
        assert torch.isneginf(lse[..., 0]).all()
        torch.testing.assert_close(lse[..., 1:], torch.logsumexp(logits, -1)[..., 1:])
        torch.testing.assert_close(out[..., 1:, :], (torch.softmax(logits, -1) @ v)[..., 1:, :])


def test_parts_chunks_are_sized_by_masks_without_heads():
    T, H, budget = 256, 4, 1 << 20
    enc = encodings.build("rope-selfextend", d_model=32, n_heads=H, train_len=64)
    enc.set_eval_length(T)
    plan = AttentionPlan(enc, torch.arange(T), None, budget)
    rows = budget // (4 * T * AttentionPlan.PART_TENSORS)  # (q, k) masks: no head or batch factor
    assert [qe - qs for qs, qe, _ in plan.chunks][:-1] == [rows] * (len(plan.chunks) - 1)


def test_logits_chunks_are_sized_by_whole_logits_of_every_head_and_sequence():
    T, H, B, budget = 64, 4, 2, 1 << 16
    enc = encodings.build("cope", d_model=32, n_heads=H, train_len=64)
    plan = AttentionPlan(enc, torch.arange(T), None, budget, batch=B)
    assert plan.path == "logits"
    rows = budget // (4 * T * H * B * AttentionPlan.LOGIT_TENSORS)
    assert rows > 1 and [qe - qs for qs, qe, _ in plan.chunks][:-1] == [rows] * (len(plan.chunks) - 1)
