"""Attention-sink rows (StreamingLLM): the two row forms and their names, which encodings can take sinks, and
the rows' validation. The attention they run: tests/model/test_sinks.py."""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.bench.config import load_config
from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError, UnknownEncodingError
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import DecoderLM, ModelConfig


def test_row_names():
    assert Row.parse("rope+sink4+sw64") == Row("rope+sink4+sw64", None)
    assert Row.parse("rope+sw64+sink4") == Row("rope+sink4", 64)
    assert Row.parse("alibi+sw8+sink2") == Row("alibi+sink2", 8)
    assert Row.parse("rope+rand+sink4+sw64") == Row("rope+rand+sink4+sw64", None)
    for row in ("rope+sink4+sw64", "rope+sw64+sink4", "alibi+sink2+sw8", "alibi+sw8+sink2", "t5+sw16+sink1",
                "rope", "rope+sw64", "rope+rand+sink4+sw64"):
        assert Row.parse(row).name == row, row
    assert Row("rope+sink4", 64).name == "rope+sw64+sink4"
    cfg = load_config(overrides={"encodings": ["rope+sink4"], "window": 64})
    assert [r.name for r in cfg.rows()] == ["rope+sw64+sink4"]


@pytest.mark.parametrize("row", ["sinusoidal+sink4+sw64", "learned+sink4+sw64"])
def test_an_absolute_base_cannot_take_sinks_and_the_error_names_the_valid_bases(row):
    with pytest.raises(ConfigError, match="token embeddings") as e:
        Row.parse(row)
    message = str(e.value)
    for base in ("rope", "alibi", "t5", "nope"):
        assert base in message.split("take them:")[1], base
    assert "sinusoidal," not in message.split("take them:")[1]


@pytest.mark.parametrize("row", ["rope-yarn+sink4+sw64", "rope-rerope+sink4+sw64", "rope-linear+sw64+sink4"])
def test_an_eval_only_variant_cannot_take_sinks(row):
    with pytest.raises(ConfigError, match="trained 'rope' model"):
        Row.parse(row)


def test_bad_sink_rows():
    with pytest.raises(ConfigError, match="W >= 1"):
        encodings.get_class("rope+sink4+sw0")
    with pytest.raises(UnknownEncodingError, match="valid encodings"):
        Row.parse("ropey+sink4+sw8")


def test_a_sink_row_needs_exactly_one_window():
    with pytest.raises(ConfigError, match="sliding window"):  # no window anywhere
        load_config(overrides={"encodings": ["rope+sink4"]})
    with pytest.raises(ConfigError, match="differs"):  # its own and the config's
        load_config(overrides={"encodings": ["rope+sink4+sw8"], "window": 16})
    assert load_config(overrides={"encodings": ["rope+sink4"], "window": 16}).window == 16
    assert load_config(overrides={"encodings": ["rope+sw16+sink4"]})
    assert load_config(overrides={"encodings": ["rope+sink4+sw16"]})
    enc = encodings.build("rope+sink4", d_model=32, n_heads=2, train_len=32)
    with pytest.raises(ValueError, match="sliding window"):
        AttentionPlan(enc, torch.arange(8), None, 64 << 20)
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="16"):
        DecoderLM(cfg, "rope+sink4+sw8", 32, window=16)(torch.zeros(1, 8, dtype=torch.long))


@pytest.mark.parametrize("base", ["rope", "alibi", "t5", "fire"])
def test_the_generated_class_is_the_base_with_sinks_and_loads_its_weights(base):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    trained = DecoderLM(cfg, base, 32, seed=0)
    for row, sinks in ((f"{base}+sink4+sw8", (4, 8)), (f"{base}+sink2", (2, None))):
        cls = encodings.get_class(row)
        assert cls.trained_as == base and cls.attention_sinks == sinks and cls.name == row
        assert issubclass(cls, encodings.get_class(base)) and encodings.get_class(base).attention_sinks is None
        assert encodings.get_class(row) is cls  # generated once
        model = DecoderLM(cfg, row, 32, seed=1, window=None if sinks[1] else 8)
        assert list(model.state_dict()) == list(trained.state_dict())
        model.load_state_dict(trained.state_dict())  # strict
        for key, value in trained.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), key


def test_the_tuning_grid_trades_sinks_for_recent_keys_at_one_cache_size():
    cls = encodings.get_class("rope+sink4+sw24")
    grid = cls.tuning_grid(28, 76, {})
    assert grid[0] == {"sinks": 4, "window": 24}  # the paper's 4 first
    assert [p["sinks"] for p in grid] == [4, 1, 2, 8] and all(p["sinks"] + p["window"] == 28 for p in grid)
    assert cls.tuned_row({"sinks": 2, "window": 26}) == ("rope+sink2+sw26", {})
    assert encodings.get_class("rope+sink2+sw26").attention_sinks == (2, 26)
    assert cls.tuning_grid(28, 28, {}) == []  # the cache holds the whole window: nothing evicted, nothing to choose
    assert encodings.get_class("rope+sink0+sw24").tuning_grid(28, 76, {}) == []  # the control is not tuned
    assert encodings.get_class("rope+sink4").tuning_grid(28, 76, {}) == []  # sinks on a trained window: no W here
    assert encodings.get_class("rope+sink1+sw2").tuning_grid(28, 76, {}) == [{"sinks": 1, "window": 2},
                                                                             {"sinks": 2, "window": 1}]
