"""The model as a whole: its attention equals the textbook one on SDPA's paths, windows cut what a query sees,
and shapes it cannot take are refused. The paths themselves: test_attention.py."""

import pytest
import torch

from posenc_bench.model.transformer import DecoderLM, ModelConfig
from tests.model.reference_attention import reference_attention


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5", "sinusoidal"])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("max_mask_bytes", [64 << 20, 1024])  # one chunk / many query chunks
def test_sdpa_paths_match_the_textbook_attention(name, window, max_mask_bytes):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, name, 16, window=window, seed=1, max_mask_bytes=max_mask_bytes).eval()
    x = torch.randint(0, 256, (2, 48))
    with torch.no_grad():
        ours = model(x)
        ref = reference_attention(model, x, window)
    assert torch.allclose(ours, ref, atol=2e-5), (ours - ref).abs().max()


def test_sliding_window_sees_only_the_last_w_tokens():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    model = DecoderLM(cfg, "nope", 16, window=4).eval()
    x = torch.randint(0, 256, (1, 20))
    y = x.clone()
    y[0, :12] = torch.randint(0, 256, (12,))  # change everything before position 12
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[0, 15:], b[0, 15:])  # one layer: position 15 sees 12..15 only
    assert not torch.equal(a[0, 14], b[0, 14])


def test_heads_must_divide_width():
    from posenc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="n_heads=3 does not divide model.d_model=32"):
        DecoderLM(ModelConfig(d_model=32, n_heads=3), "nope", 16)
    with pytest.raises(ConfigError, match="even head dimension"):
        DecoderLM(ModelConfig(d_model=36, n_heads=4), "rope", 16)


def _loss(model, x):
    logits = model(x[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())


def test_a_padded_vocabulary_is_the_unpadded_model_with_zero_rows_never_predicted():
    """vocab_multiple pads the tied embedding/output rows after every draw: the real rows and every other
    weight are the unpadded model's (the same RNG stream), the logits hold the real ids only, so the loss is
    the same; the parameter count is the real rows'."""
    plain = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), "rope", 16, seed=3)
    padded = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, vocab_multiple=64), "rope", 16, seed=3)
    w = padded.tok_emb.weight
    assert w.shape == (320, 32) and padded.lm_head.weight is w and torch.equal(w[257:], torch.zeros(63, 32))
    for (name, p), q in zip(plain.state_dict().items(), padded.state_dict().values()):
        assert torch.equal(p, q[:p.shape[0]]), name  # the real rows (every tensor but the tied matrix: all of it)
    x = torch.randint(0, 257, (2, 17))
    assert padded(x).shape == (2, 17, 257)
    assert abs(_loss(plain, x).item() - _loss(padded, x).item()) < 1e-6
    assert padded.num_parameters() == plain.num_parameters() == sum(p.numel() for p in plain.parameters())
    assert sum(p.numel() for p in padded.parameters()) == plain.num_parameters() + 63 * 32




@pytest.mark.parametrize("name", ["rope", "nope", "sinusoidal", "learned", "alibi"])
@pytest.mark.parametrize("training", [True, False])
def test_a_block_of_the_default_encodings_compiles_into_one_graph(name, training):
    """The positions' facts are worked out before the blocks: no host sync, no graph break in a block."""
    import torch._dynamo as dynamo

    from posenc_bench.encodings import consecutive_start
    from posenc_bench.model.plan import AttentionPlan

    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), name, 16).train(training)
    x = torch.randint(0, 257, (2, 16))
    with torch.set_grad_enabled(training):
        model(x)  # as in a run: the encoding's tables are made by the first forward
        pos = model.encoding.positions(2, 16, x.device)
        consecutive_start(pos)  # what the model's forward asks before its blocks
        h = model.encoding.embed(model.tok_emb(x), pos)
        plan = AttentionPlan(model.encoding, pos, None, model.max_mask_bytes, batch=2)
        dynamo.reset()
        explained = dynamo.explain(model.blocks[0])(h, model.encoding.for_layer(0), plan)
    dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@pytest.mark.slow  # compiling takes about 30 s on 2 CPU cores
@pytest.mark.parametrize("name", ["rope", "nope"])
def test_compiled_blocks_give_the_eager_loss_and_gradients(name):
    """compile_blocks (train.compile): forward loss and every gradient within 1e-5 of eager; off again, eager."""
    import torch._dynamo as dynamo

    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    eager, compiled = (DecoderLM(cfg, name, 16, seed=5) for _ in range(2))
    compiled.compile_blocks(True)
    x = torch.randint(0, 257, (2, 17))
    losses = []
    for model in (eager, compiled):
        loss = _loss(model, x)
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], atol=1e-5, rtol=0)
    for (n, p), q in zip(eager.named_parameters(), compiled.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=0), n
    compiled.compile_blocks(False)
    assert compiled._compiled is None and compiled.state_dict().keys() == eager.state_dict().keys()
    dynamo.reset()
