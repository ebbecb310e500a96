"""<encoding>+rand (Ruoss et al. 2023) as the authors' code draws them: one sorted sample from [0, M) per forward
shared by the batch, a fresh one per layer for rotary and position-reading biases, sorted random distances (a
Toeplitz bias) for distance biases, M = ceil(2048 / 40 x train length), drawn at evaluation too (seeded by row,
length and layer) but for fire+rand (ordered, as mcleish7/arithmetic). The earlier per-sequence variant
(``sampler: per-sequence``): samples per sequence, seeded by window at evaluation. M and the sampler in the cell
key, the eval options not; the wrapped encoding's parameters unchanged; n/a past M."""

import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.encodings import randomized
from posenc_bench.encodings.randomized import LayerDistances, LayerPositions
from posenc_bench.errors import PositionOutOfRange
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def test_rows_exist_for_the_encodings_that_read_positions():
    names = set(encodings.available())
    assert {"learned+rand", "sinusoidal+rand", "rope+rand", "alibi+rand", "fire+rand"} <= names
    assert not {"nope+rand", "cope+rand", "rope-linear+rand", "t5+rand"} & names  # no positions / eval-only / no
    cls = encodings.get_class("rope+rand")
    assert cls.family == "randomized positions" and "algorithmic" in cls.summary and "2305.16843" in cls.paper


def test_per_sequence_training_positions_are_sorted_distinct_samples():
    enc = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32, options={"sampler": "per-sequence"})
    assert enc.max_position == randomized.PER_SEQUENCE_MULTIPLE * 32
    pos = enc.positions(4, 32, torch.device("cpu"))
    assert pos.shape == (4, 32) and pos.min() >= 0 and pos.max() < enc.max_position
    assert (pos[:, 1:] > pos[:, :-1]).all()  # sorted, no repeats
    assert not torch.equal(pos[0], pos[1]) and not torch.equal(pos, enc.positions(4, 32, torch.device("cpu")))


def eval_positions(enc, windows, length=32):
    enc.set_eval_windows(torch.tensor(windows))
    try:
        return enc.positions(len(windows), length, torch.device("cpu"))
    finally:
        enc.set_eval_windows(None)


def test_per_sequence_evaluation_positions_are_sorted_in_range_the_same_on_rerun_and_differ_across_windows():
    """The per-sequence variant: a sorted sample from [0, M) per window, seeded by the row, the window and the
    eval seed, so that every run (and every batch size) scores the same positions."""
    enc = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32, options={"sampler": "per-sequence"}).eval()
    pos = eval_positions(enc, [0, 1, 7, 12345])
    assert pos.shape == (4, 32) and pos.min() >= 0 and pos.max() < enc.max_position  # in range
    assert (pos[:, 1:] > pos[:, :-1]).all()  # sorted, no repeats
    assert len({tuple(p.tolist()) for p in pos}) == 4  # different across windows
    assert torch.equal(pos, eval_positions(enc, [0, 1, 7, 12345]))  # the same on rerun
    assert torch.equal(pos[2:3], eval_positions(enc, [7]))  # whatever the batch: seeded by the window alone
    assert not torch.equal(pos[:, :16], eval_positions(enc, [0, 1, 7, 12345], 16))  # each length its own
    torch.manual_seed(7)  # another run (or another seed of the row's model, or its checkpoint loaded)
    again = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32, options={"sampler": "per-sequence"}).eval()
    assert again._seed != enc._seed and torch.equal(pos, eval_positions(again, [0, 1, 7, 12345]))
    other = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32,
                            options={"sampler": "per-sequence", "eval_seed": 1}).eval()
    assert not torch.equal(pos, eval_positions(other, [0, 1, 7, 12345]))  # another eval seed, other positions
    alibi = encodings.build("alibi+rand", d_model=16, n_heads=2, train_len=32, options={"sampler": "per-sequence"}).eval()
    assert not torch.equal(pos, eval_positions(alibi, [0, 1, 7, 12345]))  # another row, its own positions
    assert enc.draws.item() == 0  # evaluation draws nothing from the training stream


def test_ordered_eval_positions_are_the_arange_and_sink_rows_evaluate_at_the_cache_positions():
    ordered = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32,
                              options={"eval_positions": "ordered"}).eval()
    assert torch.equal(eval_positions(ordered, [0, 1]), torch.arange(32))
    sinks = encodings.build("rope+rand+sink2+sw8", d_model=16, n_heads=2, train_len=32).eval()
    assert torch.equal(eval_positions(sinks, [0, 1]), torch.arange(32))
    assert encodings.get_class("rope+rand+sink2+sw8").eval_options({}) == {}
    with pytest.raises(ValueError, match="eval_positions"):
        encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32, options={"eval_positions": "sorted"})


ALL_RAND = ["sinusoidal+rand", "learned+rand", "rope+rand", "alibi+rand", "kerple+rand", "fire+rand", "xpos+rand",
            "rope-partial+rand"]


def per_sequence(name: str) -> dict:
    return {name: {"sampler": "per-sequence"}}


@pytest.mark.parametrize("sampler", ["authors", "per-sequence"])
@pytest.mark.parametrize("name", ALL_RAND)
def test_an_eval_batch_at_random_positions_equals_each_window_on_its_own(name, sampler):
    """The eval forward takes drawn positions on every path (bias, folded bias, rotations, embeddings), past
    the train length too, and a window's numbers do not depend on the batch it is in."""
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={  # M 64: fire+rand's is 2 x 16
        name: {"sampler": sampler, "eval_positions": "random", "max_position": 64}}), name, 16, seed=0).eval()
    model.encoding.set_eval_length(48)
    x = torch.randint(0, 256, (3, 48))
    with torch.no_grad():
        model.encoding.set_eval_windows(torch.tensor([4, 50, 96]))
        together = model(x)
        for row, window in enumerate([4, 50, 96]):
            model.encoding.set_eval_windows(torch.tensor([window]))
            assert torch.allclose(model(x[row:row + 1]), together[row:row + 1], atol=1e-5), row


def test_samples_are_uniform_over_the_range():
    generator = torch.Generator().manual_seed(0)
    for low in (0, 1):  # positions from [0, M), distances from [1, M)
        draws = torch.cat([randomized.sorted_sample(8, 16, 64, generator, low=low).flatten() for _ in range(200)])
        counts = torch.bincount(draws, minlength=64).float()[low:]
        assert draws.min() == low and counts.shape[0] == 64 - low
        assert (counts / counts.mean() - 1).abs().max() < 0.25  # ~400 expected per value


def test_the_step_counter_makes_the_draws_reproducible_from_a_state_dict():
    for name in ("sinusoidal+rand", "rope+rand", "alibi+rand"):
        a = encodings.build(name, d_model=16, n_heads=2, train_len=8)
        a.positions(2, 8, torch.device("cpu"))
        b = encodings.build(name, d_model=16, n_heads=2, train_len=8)
        b._seed = a._seed
        b.load_state_dict(a.state_dict())
        assert torch.equal(a.positions(2, 8, torch.device("cpu")), b.positions(2, 8, torch.device("cpu")))
        if name != "sinusoidal+rand":  # per-layer draws too
            assert torch.equal(drawn(a.for_layer(1)), drawn(b.for_layer(1))), name


def drawn(view) -> torch.Tensor:
    """What a layer's view drew: its positions, or its distances."""
    return view.pos if isinstance(view, LayerPositions) else view.distances


def train_forward(enc, batch=4, length=16):
    enc.train()
    return enc.positions(batch, length, torch.device("cpu"))


def test_the_authors_absolute_rows_draw_once_per_forward_shared_by_the_batch():
    """noisy_fixed_positional_encodings: one sorted sample of T positions from [0, M) per forward, no batch
    dimension; every layer sees it (the embedding is added once)."""
    enc = encodings.build("sinusoidal+rand", d_model=16, n_heads=2, train_len=32)
    assert enc.max_position == 1639 == math.ceil(2048 / 40 * 32)  # the authors' ratio, 2048 for length 40
    pos = train_forward(enc, batch=4, length=32)
    assert pos.shape == (1, 32) and pos.min() >= 0 and pos.max() < enc.max_position  # broadcast over the batch
    assert (pos[0, 1:] > pos[0, :-1]).all()  # sorted, no repeats
    assert enc.for_layer(0) is enc and enc.for_layer(3) is enc  # no per-layer draw
    assert not torch.equal(pos, train_forward(enc, batch=4, length=32))  # a new draw each forward


@pytest.mark.parametrize("name", ["rope+rand", "rope-partial+rand", "xpos+rand", "fire+rand"])
def test_the_authors_rotary_and_position_bias_rows_draw_per_layer(name):
    """NOISY_ROTARY: a fresh rng key in every attention layer, the same positions for q and k there, one
    sample for the whole batch (FIRE: one module, one draw, per layer, as mcleish7/arithmetic)."""
    enc = encodings.build(name, d_model=16, n_heads=2, train_len=32)
    assert torch.equal(train_forward(enc), torch.arange(16))  # the model's slots; the layers hold the draws
    layers = [enc.for_layer(i) for i in range(3)]
    assert all(isinstance(v, LayerPositions) and v.own_positions for v in layers)
    for view in layers:
        assert view.pos.shape == (1, 16) and (view.pos[0, 1:] > view.pos[0, :-1]).all()
        assert view.pos.max() < enc.max_position
        assert torch.equal(view.positions(4, 16, torch.device("cpu")), view.pos)
    assert len({tuple(v.pos[0].tolist()) for v in layers}) == 3  # each layer its own draw
    assert torch.equal(enc.for_layer(1).pos, layers[1].pos)  # asked again within the forward: the same
    train_forward(enc)
    assert not torch.equal(enc.for_layer(1).pos, layers[1].pos)  # the next forward: new draws


def test_a_layers_rotation_uses_the_same_drawn_positions_for_q_and_k():
    enc = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32)
    train_forward(enc)
    view = enc.for_layer(0)
    q, k = torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    rq, rk = view.rotate(q, k, torch.arange(16))
    eq, ek = enc.base.rotate(q, k, view.pos[0])  # the plain rotation at the drawn positions
    assert torch.allclose(rq, eq) and torch.allclose(rk, ek)
    # logits depend on the drawn distances only: q_i . k_j = rotation by pos_i - pos_j
    logits = rq @ rk.transpose(-1, -2)
    shifted = enc.base.rotate(q, k, view.pos[0] + 1000)
    assert torch.allclose(logits, shifted[0] @ shifted[1].transpose(-1, -2), atol=1e-3)


@pytest.mark.parametrize("name", ["alibi+rand", "kerple+rand", "kerple-power+rand"])
def test_the_authors_distance_bias_rows_draw_sorted_distances_per_layer_and_stay_toeplitz(name):
    """compute_noisy_alibi_encodings_biases: T - 1 sorted distances from [1, M) placed by relative_shift, so
    the bias between i >= j is the plain bias at distance s[i - j] (s[0] = 0): constant along each diagonal."""
    enc = encodings.build(name, d_model=16, n_heads=2, train_len=32)
    T = 16
    assert torch.equal(train_forward(enc, length=T), torch.arange(T))
    views = [enc.for_layer(i) for i in range(2)]
    assert all(isinstance(v, LayerDistances) and v.own_positions and not v.has_low_rank_bias for v in views)
    s = views[0].distances
    assert s[0] == 0 and s.shape == (T,) and (s[1:] > s[:-1]).all() and s[1] >= 1 and s[-1] < enc.max_position
    assert not torch.equal(s, views[1].distances)  # per layer
    slots = torch.arange(T)
    bias = views[0].bias(slots, slots)[0]  # (H, T, T)
    plain = enc.base.bias(s, torch.zeros(1, dtype=torch.long))[0, :, :, 0]  # (H, T): the base at distance s_d
    for i in range(T):
        for j in range(i + 1):
            assert torch.allclose(bias[:, i, j], plain[:, i - j])  # Toeplitz, at the drawn distance
    assert torch.equal(views[0].distance_bias(T), views[0].line())
    if name == "alibi+rand":  # -m_h s_{i-j}
        slopes = enc.base.slopes
        assert torch.allclose(bias[:, 5, 2], -slopes * s[3].float())


def test_kerples_parameters_get_the_gradient_through_the_drawn_distances():
    from posenc_bench.model.transformer import DecoderLM, ModelConfig
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), "kerple+rand", 16, seed=0)
    model(torch.randint(0, 256, (2, 16))).float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoding.base.parameters())


@pytest.mark.parametrize("name", ["rope+rand", "alibi+rand", "sinusoidal+rand", "fire+rand"])
def test_the_authors_sampler_gives_every_sequence_of_the_batch_the_same_positions(name):
    """Two equal sequences in one training batch get equal outputs (the per-sequence variant: not)."""
    x = torch.randint(0, 256, (1, 16)).repeat(2, 1)
    for sampler, equal in (("authors", True), ("per-sequence", False)):
        model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={
            name: {"sampler": sampler}}), name, 16, seed=0).train()
        with torch.no_grad():
            out = model(x)
        assert torch.allclose(out[0], out[1], atol=1e-6) == equal, sampler


def test_the_authors_eval_draws_are_seeded_by_row_length_layer_and_eval_seed():
    enc = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32).eval()

    def layer_pos(e, layer, length=32):
        e.positions(3, length, torch.device("cpu"))
        return e.for_layer(layer).pos

    first = layer_pos(enc, 0)
    assert first.shape == (1, 32) and torch.equal(first, layer_pos(enc, 0))  # the same on rerun, any batch
    assert not torch.equal(first, layer_pos(enc, 1))  # per layer
    assert not torch.equal(first[:, :16], layer_pos(enc, 0, 16))  # per length
    torch.manual_seed(7)  # another seed of the row's model: the same positions
    assert torch.equal(first, layer_pos(encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32).eval(), 0))
    other = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32, options={"eval_seed": 1}).eval()
    assert not torch.equal(first, layer_pos(other, 0))
    assert enc.draws.item() == 0  # evaluation draws nothing from the training stream


def test_fire_rand_is_evaluated_at_the_ordered_positions_as_mcleish7():
    """fire+rand's eval forward is plain FIRE's on the same weights (embeddings.py: max_length = seq_length
    when not training); ``eval_positions: random`` still draws them, as for the other rows."""
    rand = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), "fire+rand", 16, seed=0).eval()
    assert rand.encoding.eval_positions == "ordered" and encodings.get_class("fire+rand").eval_options({}) == {}
    plain = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), "fire", 16, seed=0).eval()
    state = {k.replace("encoding.base.", "encoding."): v for k, v in rand.state_dict().items() if "draws" not in k}
    plain.load_state_dict(state)
    x = torch.randint(0, 256, (2, 48))
    for m in (rand, plain):
        m.encoding.set_eval_length(48)
    with torch.no_grad():
        assert torch.equal(rand(x), plain(x))
    drawn_eval = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options={
        "fire+rand": {"eval_positions": "random", "max_position": 64}}), "fire+rand", 16, seed=0).eval()  # M >= 48
    assert encodings.get_class("fire+rand").eval_options({"eval_positions": "random"})["eval_positions"] == "random"
    drawn_eval.encoding.set_eval_length(48)
    with torch.no_grad():
        assert not torch.allclose(drawn_eval(x), plain(x))


def test_wrapped_parameters_start_as_the_plain_encodings():
    for name in ("fire", "alibi", "learned"):
        plain = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), name, 16, seed=3).encoding
        wrapped = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), f"{name}+rand", 16, seed=3).encoding.base
        for (k, v), (k2, v2) in zip(plain.state_dict().items(), wrapped.state_dict().items()):
            assert k == k2
            if name != "learned":
                assert torch.equal(v, v2), k
    table = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), "learned+rand", 16, seed=3).encoding.base.table
    assert table.shape[0] == math.ceil(randomized.RATIO * 16) == 820


def test_learned_rand_is_out_of_range_past_m_with_the_reason():
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4, encoding_options={"learned+rand": {"max_position": 32}}),
                      "learned+rand", 16).eval()
    model.encoding.set_eval_length(32)
    with pytest.raises(PositionOutOfRange, match="32 rows"):
        model.encoding.set_eval_length(64)


def test_random_eval_positions_are_out_of_range_past_m():
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4, encoding_options={"rope+rand": {"max_position": 32}}),
                      "rope+rand", 16).eval()
    model.encoding.set_eval_length(32)
    with pytest.raises(PositionOutOfRange, match="M = 32"):
        model.encoding.set_eval_length(33)
    ordered = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4, encoding_options={
        "rope+rand": {"max_position": 32, "eval_positions": "ordered"}}), "rope+rand", 16).eval()
    ordered.encoding.set_eval_length(64)  # 0 .. L-1: rope runs at any length


def test_m_is_in_the_cell_key_and_refuses_a_range_below_the_train_length():
    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.keys import cell_key
    from posenc_bench.bench.rows import Row
    from posenc_bench.errors import ConfigError

    cls = encodings.get_class("learned+rand")
    assert cls.key_options(128, {}) == {"max_position": 6554, "sampler": "authors"}
    assert cls.key_options(128, {"sampler": "per-sequence"}) == {"max_position": 1024, "sampler": "per-sequence"}
    cfg = RunConfig()
    assert cell_key(cfg, Row("rope+rand"), 0, "fp") != cell_key(cfg, Row("rope"), 0, "fp")
    cfg.train.train_len = 64  # another train length resolves another M (and another key anyway)
    assert cls.key_options(64, {}) == {"max_position": 3277, "sampler": "authors"}
    seq = RunConfig()
    seq.model.encoding_options = per_sequence("rope+rand")
    assert cell_key(seq, Row("rope+rand"), 0, "fp") != cell_key(RunConfig(), Row("rope+rand"), 0, "fp")
    assert encodings.get_class("rope").key_options(128, {}) == {}  # other keys stay as they were
    ordered = RunConfig()
    ordered.model.encoding_options = {"rope+rand": {"eval_positions": "ordered", "eval_seed": 3}}
    assert cell_key(ordered, Row("rope+rand"), 0, "fp") == cell_key(RunConfig(), Row("rope+rand"), 0, "fp")
    with pytest.raises(ConfigError, match="max_position"):
        DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4, encoding_options={"rope+rand": {"max_position": 8}}),
                  "rope+rand", 16)


@pytest.mark.parametrize("name", ["sinusoidal+rand", "rope+rand", "alibi+rand", "fire+rand", "xpos+rand"])
def test_batched_positions_equal_each_sequence_on_its_own(name):
    """A training forward with per-sequence positions (the per-sequence variant) equals running each sequence
    with its positions alone (the (B, T) hooks and the per-sequence bias / folded factors)."""
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, encoding_options=per_sequence(name)), name, 16,
                      seed=0)
    x = torch.randint(0, 256, (3, 16))
    enc = model.encoding
    pos = enc.positions(3, 16, torch.device("cpu"))
    enc.positions = lambda B, T, device: pos if B == 3 else pos[row]  # noqa: E731  (B = 1: the (T,) path)
    with torch.no_grad():
        together = model(x)
        for row in range(3):
            assert torch.allclose(model(x[row:row + 1]), together[row:row + 1], atol=1e-5), row


def test_fire_rand_draws_from_mcleish7s_range_and_the_others_from_ruoss_et_als():
    """M: 2 x the train length for fire+rand (mcleish7's README: max_length 128 over 64-token additions), the
    ratio 2048 / 40 for every other +rand row (Ruoss et al.'s example.py); both in the cell key, and the error
    for a range below the train length names the row's own default."""
    fire, rope = encodings.get_class("fire+rand"), encodings.get_class("rope+rand")
    assert fire.key_options(512, {})["max_position"] == 1024 and rope.key_options(512, {})["max_position"] == 26215
    assert fire.key_options(28, {})["max_position"] == 56
    assert fire.key_options(28, {"max_position": 1434})["max_position"] == 1434  # an explicit M is kept
    assert fire(d_model=32, n_heads=4, train_len=16).max_position == 32
    with pytest.raises(ValueError, match=r"the default: ceil\(2 x train length\)"):
        fire(d_model=32, n_heads=4, train_len=16, max_position=8)
    with pytest.raises(ValueError, match=r"the default: ceil\(2048 / 40 x train length\)"):
        rope(d_model=32, n_heads=4, train_len=16, max_position=8)
    assert "M = ceil(2 x train length) (fire's own" in fire.summary  # what `posenc-bench list` says
    assert "M = ceil(2048 / 40 x train length) (Ruoss et al.'s ratio)," in rope.summary


def test_a_training_window_longer_than_m_draws_every_position_as_mcleish7():
    """embeddings.py: a sequence longer than max_length takes max_length = seq_length, so the draw is every
    position; within M it is a draw; at random eval past M the row is refused (n/a)."""
    enc = encodings.get_class("fire+rand")(d_model=32, n_heads=4, train_len=16).train()  # M = 32
    enc.positions(1, 40, torch.device("cpu"))
    assert torch.equal(enc.for_layer(0).pos.flatten(), torch.arange(40))
    enc.positions(1, 20, torch.device("cpu"))
    drawn = enc.for_layer(0).pos.flatten()
    assert drawn.max() < 32 and not torch.equal(drawn, torch.arange(20))
    with pytest.raises(PositionOutOfRange):
        encodings.get_class("fire+rand")(d_model=32, n_heads=4, train_len=16, eval_positions="random").set_eval_length(40)
