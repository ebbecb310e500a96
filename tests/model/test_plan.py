"""The attention plan: the path a forward takes (``choose_path``, a pure function of the encoding's declared
capabilities and the forward's facts), its chunks and masks within the memory budget, and the attention-sinks
geometry (``sink_window``, ``cache_positions``). The paths that run it: test_attention.py, test_explicit.py,
test_sinks.py."""

import types

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.errors import ConfigError
from posenc_bench.model.attention import PATHS
from posenc_bench.model.plan import AttentionPlan, Facts, cache_positions, choose_path, sink_window
from posenc_bench.model.transformer import DecoderLM, ModelConfig

CAPABILITIES = ("has_bias", "has_low_rank_bias", "has_distance_bias", "has_attention_logits", "has_attention_parts")
FACTS = {"window": None, "block": None, "sinks": 0, "grad": False, "bias_kernel": False}
BIAS, LOW_RANK, DISTANCE, LOGITS, PARTS = CAPABILITIES


def declaring(*flags):
    """An encoding that declares these capabilities and none of the others: all choose_path may read."""
    return types.SimpleNamespace(**{flag: flag in flags for flag in CAPABILITIES})


@pytest.mark.parametrize("flags,facts,path", [
    ((), {}, "fused"),
    ((), {"grad": True}, "fused"),  # training
    ((), {"window": 8}, "mask"),
    ((), {"block": 32}, "mask"),
    ((), {"sinks": 4, "window": 8}, "sinks"),
    ((BIAS,), {}, "mask"),
    ((BIAS, LOW_RANK), {}, "folded"),
    ((BIAS, LOW_RANK), {"window": 8, "grad": True}, "folded"),
    ((BIAS, LOW_RANK), {"sinks": 2, "window": 8}, "sinks"),  # the sinks' bias needs the mask
    ((BIAS, LOW_RANK), {"fold": False}, "mask"),  # CUDA: the bias mask is faster than folding there
    ((BIAS, LOW_RANK), {"fold": False, "grad": True}, "mask"),
    # a learned bias trains on the kernel where the device has it (CPU flash): a distance table without blocks on
    # the distance_bias path (on (T,) or per-sequence positions), any other bias on bias_grad; else a mask
    ((BIAS, DISTANCE), {"grad": True, "bias_kernel": True}, "distance_bias"),
    ((BIAS, DISTANCE), {"grad": True, "bias_kernel": True, "window": 200}, "distance_bias"),
    ((BIAS, DISTANCE), {"bias_kernel": True}, "mask"),  # evaluation
    ((BIAS, DISTANCE), {"grad": True}, "mask"),  # no kernel on this device
    ((BIAS, DISTANCE), {"grad": True, "bias_kernel": True, "block": 64}, "mask"),
    ((BIAS, DISTANCE), {"grad": True, "bias_kernel": True, "sinks": 1, "window": 5}, "sinks"),
    ((BIAS, DISTANCE, LOW_RANK), {"grad": True, "bias_kernel": True}, "folded"),
    ((BIAS,), {"grad": True, "bias_kernel": True}, "bias_grad"),
    ((BIAS,), {"grad": True, "bias_kernel": True, "window": 8}, "bias_grad"),
    ((BIAS,), {"grad": True}, "mask"),
    ((DISTANCE,), {"grad": True, "bias_kernel": True}, "fused"),  # no bias declared: nothing to train
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
    ("t5", None, 64, True, "distance_bias"),
    ("t5", None, 600, True, "distance_bias"),
    ("kerple", None, 64, True, "distance_bias"),
    ("kerple+rand", None, 64, True, "distance_bias"),
    ("fire", None, 64, True, "bias_grad"),
    ("fire", None, 64, False, "mask"),
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


def test_plan_uses_fused_causal_path_only_without_bias_and_window():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    pos = torch.arange(64)
    assert AttentionPlan(DecoderLM(cfg, "rope", 16).encoding, pos, None, 1 << 20).path == "fused"
    assert AttentionPlan(DecoderLM(cfg, "rope", 16).encoding, pos, 8, 1 << 20).path == "mask"
    with torch.no_grad():
        plan = AttentionPlan(DecoderLM(cfg, "t5", 16).encoding, pos, None, 4 * 4 * 64 * 10)
    assert plan.path == "mask"
    assert [c[0] for c in plan.chunks] == list(range(0, 64, 10))  # 10 query rows per chunk fit the budget
    mask = plan.mask(1, torch.float32)
    assert mask.shape == (1, 4, 10, 20) and mask.dim() == 4  # 4-D: SDPA's fused CPU kernel, not math


def test_chunked_mask_memory_is_bounded():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    enc = DecoderLM(cfg, "t5", 16).encoding
    with torch.no_grad():  # evaluation: the mask path, one chunk's mask alive at a time
        plan = AttentionPlan(enc, torch.arange(2048), None, 1 << 20)
        biggest = max(plan.mask(i, torch.float32).numel() * 4 for i in range(len(plan.chunks)))
    assert plan.path == "mask" and biggest <= 1 << 20  # vs 4 * 2048 * 2048 * 4 = 64 MiB for the full matrix


@pytest.mark.parametrize("name", ["t5", "fire", "fire+rand"])
def test_training_bias_chunks_are_bias_rows_whatever_the_budget(name):
    # training keeps every chunk's mask for backward anyway: the budget bounds nothing, the chunk is the fastest
    enc = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), name, 16).encoding
    pos = enc.positions(2, 1024, torch.device("cpu")) if enc.batched_positions and name.endswith("+rand") else torch.arange(1024)
    plan = AttentionPlan(enc, pos, None, 1 << 10, batch=2)
    assert plan.path in ("distance_bias", "bias_grad")
    assert [c[:2] for c in plan.chunks] == [(a, a + AttentionPlan.BIAS_ROWS) for a in range(0, 1024, AttentionPlan.BIAS_ROWS)]


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


@pytest.mark.parametrize("row,window,length,want", [
    ("rope", None, 100, (0, None)), ("rope", 16, 100, (0, 16)),  # no sinks: the model's window as it is
    ("rope+sink4+sw8", None, 100, (4, 8)), ("rope+sink4", 8, 100, (4, 8)), ("rope+sink4+sw8", 8, 100, (4, 8)),
    ("rope+sink4+sw8", None, 12, (0, None)), ("rope+sink4+sw8", None, 13, (4, 8)),  # S + W = 12 fit the cache
    ("rope+sink4+sw8", None, None, (4, 8)), ("rope+sink0+sw8", None, 5, (0, 8)),  # no sinks: the window stays
])
def test_sink_window_gives_the_sinks_and_the_window(row, window, length, want):
    assert sink_window(encodings.get_class(row), window, length) == want


def test_sink_window_needs_exactly_one_window_and_names_the_row():
    with pytest.raises(ConfigError, match=r"rope\+sink4: attention sinks need a sliding window.*rope\+sink4\+sw64"):
        sink_window(encodings.get_class("rope+sink4"), None)
    with pytest.raises(ConfigError, match=r"rope\+sink4\+sw8: its sink window 8 differs from the model's window 16"):
        sink_window(encodings.get_class("rope+sink4+sw8"), 16)


def test_cache_positions_stop_at_the_last_slot_of_the_cache():
    assert cache_positions(torch.arange(16), 4, 8).tolist() == list(range(12)) + [11] * 4
    assert cache_positions(torch.arange(20).view(2, 10), 2, 3).tolist() == [[0, 1, 2, 3, 4] + [4] * 5, [4] * 10]


def test_the_logits_path_trains_in_chunks_of_its_own_size_whatever_the_budget():
    """In training autograd keeps every chunk's tensors, so the budget bounds nothing: TRAIN_LOGIT_ROWS queries
    a chunk; in evaluation the budget sizes them."""
    enc = encodings.build("cope", d_model=32, n_heads=4, train_len=32)
    pos = torch.arange(1000)
    with torch.enable_grad():
        plan = AttentionPlan(enc, pos, None, 1 << 12)
    assert {qe - qs for qs, qe, _ in plan.chunks} == {AttentionPlan.TRAIN_LOGIT_ROWS, 1000 % AttentionPlan.TRAIN_LOGIT_ROWS}
    with torch.no_grad():
        assert max(qe - qs for qs, qe, _ in AttentionPlan(enc, pos, None, 1 << 12).chunks) == 1


@pytest.mark.parametrize("name,window,block,path", [
    ("rope", None, None, "fused"), ("rope", 16, None, "mask"), ("rope-rerope", None, None, "parts"),
    ("rope-selfextend", None, None, "parts"), ("rope+sink2+sw12", None, None, "sinks"), ("t5", None, None, "mask"),
    ("cope", None, None, "logits"), ("xpos+bca", None, 8, "mask")])
def test_a_plan_of_the_last_queries_gives_the_whole_plans_last_rows(name, window, block, path):
    """``queries_from`` P: the chunks cover queries P .. T - 1 only (what continues a KV cache of P tokens),
    each with the keys it has in the whole plan, on the fused, mask, parts, sinks, logits and blockwise paths;
    P inside a chunk, a block, or at 0 (the whole plan)."""
    from posenc_bench.model.attention import attend

    enc = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), name, 16, seed=0).encoding
    enc.set_eval_length(50)  # ReRoPE and Self-Extend take their explicit path past the train length
    if block is not None:
        enc.attention_block = lambda T: block
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 4, 50, 8, generator=gen)
    pos = torch.arange(50)
    with torch.no_grad():
        whole = attend(enc, AttentionPlan(enc, pos, window, 4 * 4 * 50 * 7), q, k, v, 0.3)
        assert AttentionPlan(enc, pos, window, 1).path == path
        for start in (0, 13, 40, 49):
            plan = AttentionPlan(enc, pos, window, 4 * 4 * 50 * 7, queries_from=start)
            assert plan.chunks[0][0] == start and plan.chunks[-1][1] == 50
            assert torch.allclose(attend(enc, plan, q, k, v, 0.3), whole[:, :, start:], atol=1e-6)
