"""The attention plan: the path a forward takes (``choose_path``, a pure function of the encoding's declared
capabilities and the forward's facts), one table that runs it, the chunks and masks, and the folded and banded
bias paths against the textbook attention. The explicit-logits paths: test_explicit.py; sinks:
test_sinks.py."""

import types

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model import attention
from posenc_bench.model.attention import PATHS, AttentionPlan, Facts, choose_path, fold_bias, fold_channels
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from tests.model.reference_attention import assert_matches_reference_attention

CAPABILITIES = ("has_bias", "has_low_rank_bias", "has_distance_bias", "has_attention_logits", "has_attention_parts")
FACTS = {"window": None, "block": None, "sinks": 0, "grad": False, "batched": False, "length": 1024, "band": None}
BIAS, LOW_RANK, DISTANCE, LOGITS, PARTS = CAPABILITIES


def declaring(*flags):
    """An encoding that declares these capabilities and none of the others: all choose_path may read."""
    return types.SimpleNamespace(**{flag: flag in flags for flag in CAPABILITIES})


@pytest.mark.parametrize("flags,facts,path", [
    ((), {}, "fused"),
    ((), {"grad": True, "batched": True}, "fused"),  # +rand training: positions do not choose the path
    ((), {"window": 8}, "mask"),
    ((), {"block": 32}, "mask"),
    ((), {"sinks": 4, "window": 8}, "sinks"),
    ((BIAS,), {}, "mask"),
    ((BIAS, LOW_RANK), {}, "folded"),
    ((BIAS, LOW_RANK), {"window": 8, "grad": True, "batched": True}, "folded"),
    ((BIAS, LOW_RANK), {"sinks": 2, "window": 8}, "sinks"),  # the sinks' bias needs the mask
    ((BIAS, LOW_RANK), {"fold": False}, "mask"),  # CUDA: the bias mask is faster than folding there
    ((BIAS, LOW_RANK), {"fold": False, "grad": True, "batched": True}, "mask"),
    # a learned distance bias trains on its band: with gradients, (T,) positions, no blocks, the kernel (band)
    # and T >= BAND_MIN x W; otherwise it is a mask like any bias
    ((BIAS, DISTANCE), {"grad": True, "band": 128}, "distance_bias"),
    ((BIAS, DISTANCE), {"grad": True, "band": 128, "window": 200}, "distance_bias"),
    ((BIAS, DISTANCE), {"grad": True, "band": 256}, "distance_bias"),  # 1024 = BAND_MIN x 256
    ((BIAS, DISTANCE), {"grad": True, "band": 257}, "mask"),
    ((BIAS, DISTANCE), {"band": 128}, "mask"),
    ((BIAS, DISTANCE), {"grad": True}, "mask"),  # no band kernel on this device
    ((BIAS, DISTANCE), {"grad": True, "band": 128, "batched": True}, "mask"),
    ((BIAS, DISTANCE), {"grad": True, "band": 128, "block": 64}, "mask"),
    ((BIAS, DISTANCE), {"grad": True, "band": 128, "sinks": 1, "window": 5}, "sinks"),
    ((BIAS, DISTANCE, LOW_RANK), {"grad": True, "band": 128}, "folded"),
    ((DISTANCE,), {"grad": True, "band": 128}, "fused"),  # no bias declared: nothing to train
    ((LOGITS,), {}, "logits"),
    ((LOGITS,), {"sinks": 4, "window": 8}, "logits"),  # CoPE counts positions over the visible set itself
    ((LOGITS, BIAS, LOW_RANK), {}, "logits"),  # the bias goes into the mask it gets
    ((LOGITS, PARTS), {}, "parts"),
    ((LOGITS, PARTS), {"window": 8, "grad": True, "block": 16}, "parts"),
    ((LOGITS, PARTS), {"sinks": 4, "window": 8}, "logits"),  # a sink chunk's keys are not one range
    ((PARTS,), {}, "fused"),  # parts without logits: a plain encoding at this length (ReRoPE within its w)
])
def test_the_path_is_a_pure_function_of_capabilities_and_facts(flags, facts, path):
    assert choose_path(declaring(*flags), Facts(**{**FACTS, **facts})) == path
    assert path in PATHS


@pytest.mark.parametrize("name,window,T,grad,path", [
    ("rope", None, 64, False, "fused"),
    ("rope", 8, 64, False, "mask"),
    ("rope+rand", None, 64, True, "fused"),
    ("alibi", None, 64, True, "folded"),
    ("t5", None, 64, True, "mask"),
    ("t5", None, 600, True, "distance_bias"),
    ("t5", None, 600, False, "mask"),
    ("cope", None, 64, False, "logits"),
    ("rope-rerope", None, 64, False, "parts"),
    ("rope-rerope", None, 4, False, "fused"),  # within its w = 4 (train length 32 / 8): plain rope
    ("xpos+bca", None, 64, False, "mask"),  # blocks past the train length
    ("xpos+bca", None, 32, False, "fused"),
    ("rope+sink4+sw8", None, 64, False, "sinks"),
    ("rope+sink4+sw8", None, 12, False, "fused"),  # the cache holds the whole window
    ("alibi+sink2+sw8", None, 64, False, "sinks"),
    ("cope+sink4+sw8", None, 64, False, "logits"),
])
def test_the_plan_takes_the_path_its_encoding_declares(name, window, T, grad, path):
    enc = encodings.build(name, d_model=32, n_heads=4, train_len=32)
    enc.set_eval_length(T)
    with torch.set_grad_enabled(grad):
        plan = AttentionPlan(enc, enc.positions(2, T, torch.device("cpu")), window, 64 << 20, batch=2)
    assert plan.path == path
    assert (plan.distance_bias is not None) == (path == "distance_bias")
    assert (plan.chunks == [(0, T, 0)] and plan.mask(0, torch.float32) is None) or path != "fused"


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


def test_plan_uses_fused_causal_path_only_without_bias_and_window():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    pos = torch.arange(64)
    assert AttentionPlan(DecoderLM(cfg, "rope", 16).encoding, pos, None, 1 << 20).path == "fused"
    assert AttentionPlan(DecoderLM(cfg, "rope", 16).encoding, pos, 8, 1 << 20).path == "mask"
    plan = AttentionPlan(DecoderLM(cfg, "t5", 16).encoding, pos, None, 4 * 4 * 64 * 10)
    assert plan.path == "mask"
    assert [c[0] for c in plan.chunks] == list(range(0, 64, 10))  # 10 query rows per chunk fit the budget
    mask = plan.mask(1, torch.float32)
    assert mask.shape == (1, 4, 10, 20) and mask.dim() == 4  # 4-D: SDPA's fused CPU kernel, not math


def test_chunked_mask_memory_is_bounded():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    enc = DecoderLM(cfg, "t5", 16).encoding
    plan = AttentionPlan(enc, torch.arange(2048), None, 1 << 20)
    biggest = max(plan.mask(i, torch.float32).numel() * 4 for i in range(len(plan.chunks)))
    assert biggest <= 1 << 20  # vs 4 * 2048 * 2048 * 4 = 64 MiB for the full matrix


def test_alibi_is_folded_into_qk_channels_and_builds_no_bias():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    plan = AttentionPlan(DecoderLM(cfg, "alibi", 16).encoding, torch.arange(1200), None, 64 << 20)
    assert plan.path == "folded" and not plan.mask_bias
    assert [c[:2] for c in plan.chunks][:2] == [(0, 256), (256, 512)]  # FOLD_ROWS queries each
    assert plan.mask(0, torch.float32) is None  # square causal chunk: SDPA's own causal mask
    assert plan.mask(1, torch.float32).shape == (1, 1, 256, 512)  # causal only: no per-head bias


@pytest.mark.parametrize("budget,shared", [(64 << 20, True), (256 * 1024 * 4, False)])
def test_chunk_masks_are_shared_by_the_layers_only_within_the_memory_budget(budget, shared):
    # 1200 positions in 256-row chunks: the 4 masked chunks need 256 x (512 + 768 + 1024 + 1200) x 4 bytes = 3.5 MiB
    plan = AttentionPlan(DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), "alibi", 16).encoding,
                         torch.arange(1200), None, budget)
    first = [plan.mask(i, torch.float32) for i in range(1, len(plan.chunks))]
    again = [plan.mask(i, torch.float32) for i in range(1, len(plan.chunks))]
    assert all((a is b) == shared for a, b in zip(first, again))  # the next layer gets the same tensors, or new ones
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(plan._masks) == (4 if shared else 0)


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
    monkeypatch.setattr(attention, "FOLD_DEVICES", ())
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
    monkeypatch.setattr(attention, "BAND_MIN", 2)  # 300 tokens >= 2 x 128: the band path
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, "t5", 16, window=window, seed=1, max_mask_bytes=max_mask_bytes)
    x = torch.randint(0, 256, (2, 300))
    plan = AttentionPlan(model.encoding, torch.arange(300), window, max_mask_bytes)
    assert plan.path == "distance_bias" and plan.distance_bias is not None  # grad enabled on CPU: the band path
    assert max(qe - qs for qs, qe, _ in plan.chunks) <= bias_rows
    assert AttentionPlan(model.encoding, torch.arange(200), window, max_mask_bytes).path == "mask"  # short
    with torch.no_grad():
        assert AttentionPlan(model.encoding, torch.arange(300), window, max_mask_bytes).distance_bias is None
    grads = assert_matches_reference_attention(model, x, window, grad_atol=1e-7)
    assert grads["encoding.relative_attention_bias.weight"].abs().sum() > 0
