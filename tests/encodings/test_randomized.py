"""<encoding>+rand (Ruoss et al. 2023): sorted samples without replacement from [0, M) in training and, seeded by
window, at evaluation (or 0 .. L-1 there, ``eval_positions: ordered``), M in the cell key and the eval options
not, the wrapped encoding's parameters unchanged, n/a past M."""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.encodings import randomized
from posenc_bench.errors import PositionOutOfRange
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def test_rows_exist_for_the_encodings_that_read_positions():
    names = set(encodings.available())
    assert {"learned+rand", "sinusoidal+rand", "rope+rand", "alibi+rand", "fire+rand"} <= names
    assert not {"nope+rand", "cope+rand", "rope-linear+rand", "t5+rand"} & names  # no positions / eval-only / no
    cls = encodings.get_class("rope+rand")
    assert cls.family == "randomized positions" and "algorithmic" in cls.summary and "2305.16843" in cls.paper


def test_training_positions_are_sorted_distinct_samples():
    enc = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32)
    assert enc.max_position == randomized.MULTIPLE * 32
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


def test_the_rand_evaluation_positions_are_sorted_in_range_the_same_on_rerun_and_differ_across_windows():
    """As the authors evaluate: a sorted sample from [0, M) per window, seeded by the row, the window and the
    eval seed, so that every run (and every batch size) scores the same positions."""
    enc = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32).eval()
    pos = eval_positions(enc, [0, 1, 7, 12345])
    assert pos.shape == (4, 32) and pos.min() >= 0 and pos.max() < enc.max_position  # in range
    assert (pos[:, 1:] > pos[:, :-1]).all()  # sorted, no repeats
    assert len({tuple(p.tolist()) for p in pos}) == 4  # different across windows
    assert torch.equal(pos, eval_positions(enc, [0, 1, 7, 12345]))  # the same on rerun
    assert torch.equal(pos[2:3], eval_positions(enc, [7]))  # whatever the batch: seeded by the window alone
    assert not torch.equal(pos[:, :16], eval_positions(enc, [0, 1, 7, 12345], 16))  # each length its own
    torch.manual_seed(7)  # another run (or another seed of the row's model, or its checkpoint loaded)
    again = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32).eval()
    assert again._seed != enc._seed and torch.equal(pos, eval_positions(again, [0, 1, 7, 12345]))
    other = encodings.build("rope+rand", d_model=16, n_heads=2, train_len=32, options={"eval_seed": 1}).eval()
    assert not torch.equal(pos, eval_positions(other, [0, 1, 7, 12345]))  # another eval seed, other positions
    alibi = encodings.build("alibi+rand", d_model=16, n_heads=2, train_len=32).eval()
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


@pytest.mark.parametrize("name", ["sinusoidal+rand", "learned+rand", "rope+rand", "alibi+rand", "kerple+rand",
                                  "fire+rand", "xpos+rand", "rope-partial+rand"])
def test_an_eval_batch_at_random_positions_equals_each_window_on_its_own(name):
    """The eval forward takes (B, T) positions on every path (bias, folded bias, rotations, embeddings), past
    the train length too, and a window's numbers do not depend on the batch it is in."""
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), name, 16, seed=0).eval()
    model.encoding.set_eval_length(48)
    x = torch.randint(0, 256, (3, 48))
    with torch.no_grad():
        model.encoding.set_eval_windows(torch.tensor([4, 50, 96]))
        together = model(x)
        for row, window in enumerate([4, 50, 96]):
            model.encoding.set_eval_windows(torch.tensor([window]))
            assert torch.allclose(model(x[row:row + 1]), together[row:row + 1], atol=1e-5), row


def test_samples_are_uniform_over_the_range():
    enc = encodings.build("alibi+rand", d_model=16, n_heads=2, train_len=16, options={"max_position": 64})
    counts = torch.bincount(torch.cat([enc.positions(8, 16, torch.device("cpu")).flatten() for _ in range(200)]),
                            minlength=64).float()
    assert counts.shape[0] == 64 and (counts / counts.mean() - 1).abs().max() < 0.25  # 400 expected per position


def test_the_step_counter_makes_the_draws_reproducible_from_a_state_dict():
    a = encodings.build("sinusoidal+rand", d_model=16, n_heads=2, train_len=8)
    a.positions(2, 8, torch.device("cpu"))
    b = encodings.build("sinusoidal+rand", d_model=16, n_heads=2, train_len=8)
    b._seed = a._seed
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.positions(2, 8, torch.device("cpu")), b.positions(2, 8, torch.device("cpu")))


def test_wrapped_parameters_start_as_the_plain_encodings():
    for name in ("fire", "alibi", "learned"):
        plain = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), name, 16, seed=3).encoding
        wrapped = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), f"{name}+rand", 16, seed=3).encoding.base
        for (k, v), (k2, v2) in zip(plain.state_dict().items(), wrapped.state_dict().items()):
            assert k == k2
            if name != "learned":
                assert torch.equal(v, v2), k
    table = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), "learned+rand", 16, seed=3).encoding.base.table
    assert table.shape[0] == randomized.MULTIPLE * 16


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
    assert cls.key_options(128, {}) == {"max_position": 1024}
    cfg = RunConfig()
    assert cell_key(cfg, Row("rope+rand"), 0, "fp") != cell_key(cfg, Row("rope"), 0, "fp")
    cfg.train.train_len = 64  # another train length resolves another M (and another key anyway)
    assert cls.key_options(64, {}) == {"max_position": 512}
    assert encodings.get_class("rope").key_options(128, {}) == {}  # other keys stay as they were
    ordered = RunConfig()
    ordered.model.encoding_options = {"rope+rand": {"eval_positions": "ordered", "eval_seed": 3}}
    assert cell_key(ordered, Row("rope+rand"), 0, "fp") == cell_key(RunConfig(), Row("rope+rand"), 0, "fp")
    with pytest.raises(ConfigError, match="max_position"):
        DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4, encoding_options={"rope+rand": {"max_position": 8}}),
                  "rope+rand", 16)


@pytest.mark.parametrize("name", ["sinusoidal+rand", "rope+rand", "alibi+rand", "fire+rand", "xpos+rand"])
def test_batched_positions_equal_each_sequence_on_its_own(name):
    """A training forward with per-sequence positions equals running each sequence with its positions alone
    (the (B, T) hooks and the per-sequence bias / folded factors)."""
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), name, 16, seed=0)
    x = torch.randint(0, 256, (3, 16))
    enc = model.encoding
    pos = enc.positions(3, 16, torch.device("cpu"))
    enc.positions = lambda B, T, device: pos if B == 3 else pos[row]  # noqa: E731  (B = 1: the (T,) path)
    with torch.no_grad():
        together = model(x)
        for row in range(3):
            assert torch.allclose(model(x[row:row + 1]), together[row:row + 1], atol=1e-5), row
