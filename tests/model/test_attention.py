"""Running the attention plan: ``attend`` sends every chunk through one table, ``PATHS``, and the folded and
banded bias paths equal the textbook attention. The plan itself (paths, chunks, masks): test_plan.py; the
explicit-logits paths: test_explicit.py; sinks: test_sinks.py."""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model import attention, distance_bias, plan as attention_plan
from posenc_bench.model.attention import PATHS, fold_bias, fold_channels
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from tests.model.reference_attention import assert_matches_reference_attention


def test_attend_runs_every_chunk_through_the_paths_table(monkeypatch):
    calls = []

    def recording(plan, c):
        calls.append((c.i, c.q.shape[-2], c.k.shape[-2]))
        return attention.sdpa_attention(plan, c)

    monkeypatch.setitem(PATHS, "mask", recording)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), "t5", 16, max_mask_bytes=4 * 4 * 40 * 10).eval()
    with torch.no_grad():
        model(torch.randint(0, 256, (1, 40)))
    # 10 queries per chunk, keys [0, qe): each layer once through every chunk
    assert calls == [(i, 10, 10 * (i + 1)) for i in range(4)] * 2


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("fold_rows", [512, 8])  # one chunk / many
def test_folded_alibi_matches_the_explicit_bias_forward_and_gradients(monkeypatch, window, fold_rows):
    monkeypatch.setattr(AttentionPlan, "FOLD_ROWS", fold_rows)
    cfg = ModelConfig(d_model=48, n_layers=2, n_heads=6)  # 6 heads: slopes that are not powers of two
    model = DecoderLM(cfg, "alibi", 16, window=window, seed=3)
    x = torch.randint(0, 256, (2, 40))
    assert_matches_reference_attention(model, x, window, grad_atol=1e-6)


def test_where_the_device_does_not_fold_alibi_goes_into_the_mask_and_matches_the_reference(monkeypatch):
    """CUDA is not in FOLD_DEVICES (its bias mask is the faster path): emulated here on the CPU."""
    enc = encodings.build("alibi", d_model=32, n_heads=4, train_len=32)
    pos = torch.arange(64)
    assert AttentionPlan(enc, pos, None, 64 << 20).path == "folded"  # the CPU folds
    monkeypatch.setattr(attention_plan, "FOLD_DEVICES", ())
    monkeypatch.setattr(distance_bias, "supported", lambda x: False)  # nor has CUDA the CPU's bias kernel
    assert AttentionPlan(enc, pos, None, 64 << 20).path == "mask"
    model = DecoderLM(ModelConfig(d_model=48, n_layers=2, n_heads=6), "alibi", 16, seed=3)
    assert_matches_reference_attention(model, torch.randint(0, 256, (2, 40)), None, grad_atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-5)])
def test_folded_alibi_keeps_precision_at_long_lengths(dtype, tol):
    """At 8192 tokens with 16 heads (slopes up to 0.71) the folded logits give the attention weights of the
    exact float64 bias within 1e-5, also when q and k are bf16 (the bias channel is split into high and low
    parts)."""
    H, D, T = 16, 8, 8192
    plan = AttentionPlan(DecoderLM(ModelConfig(d_model=H * D, n_layers=1, n_heads=H), "alibi", 16).encoding,
                         torch.arange(T), None, 64 << 20)
    i = len(plan.chunks) - 2
    qs, qe, ks = plan.chunks[i]
    torch.manual_seed(0)
    q, k, v = torch.randn(1, H, qe - qs, D).to(dtype), torch.randn(1, H, qe - ks, D).to(dtype), torch.randn(1, H, qe - ks, D)
    scale = D**-0.5
    qa, ka, va = fold_bias(plan, i, q, k, v.to(dtype), scale)
    assert qa.shape[-1] == ka.shape[-1] == va.shape[-1] == D + fold_channels(plan, D, dtype)
    assert torch.equal(va[..., :D], v.to(dtype)) and not va[..., D:].any()  # v gets as many zero channels
    rows = [0, 127, qe - qs - 1]  # first, middle, last query of the chunk
    folded = (qa[0, :, rows].float() @ ka[0].float().transpose(-1, -2)) * scale  # (H, 3, k), float32
    qpos = torch.arange(qs, qe)[rows]
    rel = (torch.arange(ks, qe)[None, :] - qpos[:, None]).double()
    exact = (q[0, :, rows].double() @ k[0].double().transpose(-1, -2)) * scale + plan.encoding.slopes.double()[:, None, None] * rel
    causal = torch.where(rel <= 0, 0.0, float("-inf"))
    p_folded = (folded.double() + causal).softmax(-1)
    p_exact = (exact + causal).softmax(-1)
    assert (p_folded - p_exact).abs().max() < tol


@pytest.mark.parametrize("window,max_mask_bytes,bias_rows", [(None, 64 << 20, 512), (None, 64 << 20, 40), (None, 4096, 512),
                                                             (9, 64 << 20, 512), (200, 64 << 20, 64)])
def test_t5_training_path_matches_sdpa_forward_and_gradients(monkeypatch, window, max_mask_bytes, bias_rows):
    """The flash + band-gradient path for a learned distance bias (training on CPU) equals the textbook
    attention: logits and the gradients of every parameter, the T5 table included (300 tokens: far past
    max_distance=128, so the shared last bucket gets its gradient from the row-sum identity)."""
    monkeypatch.setattr(AttentionPlan, "BIAS_ROWS", bias_rows)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, "t5", 16, window=window, seed=1, max_mask_bytes=max_mask_bytes)
    x = torch.randint(0, 256, (2, 300))
    plan = AttentionPlan(model.encoding, torch.arange(300), window, max_mask_bytes)
    assert plan.path == "distance_bias" and plan.distance_bias is not None  # grad enabled on CPU: the band path
    assert max(qe - qs for qs, qe, _ in plan.chunks) <= bias_rows
    with torch.no_grad():
        assert AttentionPlan(model.encoding, torch.arange(300), window, max_mask_bytes).distance_bias is None
    grads = assert_matches_reference_attention(model, x, window, grad_atol=1e-7)
    assert grads["encoding.relative_attention_bias.weight"].abs().sum() > 0
