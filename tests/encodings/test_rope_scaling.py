"""RoPE scalings on the trained rope model: each one's frequencies are transformers' for the same config."""

import inspect
import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.bench.config import RunConfig, load_config
from posenc_bench.bench.keys import cell_key, eval_key
from posenc_bench.bench.rows import Row
from posenc_bench.encodings.rope import RoPE, default_inv_freq, rope_cos_sin
from posenc_bench.encodings.rope_scaling import LLAMA3_FREQ_FACTORS, SCALING_TABLE, dynamic_frequencies, ntk_inv_freq
from posenc_bench.errors import ConfigError

T, D_MODEL, HEADS = 64, 64, 2  # head_dim 32
HEAD_DIM = D_MODEL // HEADS
ZERO_SHOT = ["rope-ntk", "rope-dynamic", "rope-yarn", "rope-llama3"]
FINETUNED = ["rope-ft", "rope-linear-ft", "rope-ntk-ft", "rope-dynamic-ft", "rope-yarn-ft", "rope-llama3-ft"]


def build(name, **options):
    return encodings.build(name, d_model=D_MODEL, n_heads=HEADS, train_len=T, options=options)


def hf_rotary(rope_type, **params):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, max_position_embeddings=T,
                      rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **params})
    return LlamaRotaryEmbedding(cfg)


def test_every_variant_is_eval_only_on_the_rope_checkpoint():
    for name in ZERO_SHOT + FINETUNED:
        cls = encodings.get_class(name)
        assert cls.trained_as == "rope" and cls.finetuned == name.endswith("-ft"), name


@pytest.mark.parametrize("name", ZERO_SHOT + ["rope-linear"])
def test_at_and_below_the_train_length_every_zero_shot_variant_is_plain_rope(name):
    enc, plain = build(name), RoPE(d_model=D_MODEL, n_heads=HEADS, train_len=T)
    for length in (T // 2, T):
        enc.set_eval_length(length)
        assert torch.equal(enc.inv_freq, plain.inv_freq) and enc.attention_scale == 1.0, (name, length)


def test_ntk_is_the_base_formula_and_transformers_dynamic_at_factor_1():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for s in (1.5, 2.0, 4.0):
        ours, scale = ntk_inv_freq(HEAD_DIM, 10000.0, s)
        formula, _ = default_inv_freq(HEAD_DIM, 10000.0 * s ** (HEAD_DIM / (HEAD_DIM - 2)))
        assert scale == 1.0 and torch.equal(ours, formula)
        cfg = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, max_position_embeddings=T,
                          rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 1.0})
        hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=int(s * T))
        assert torch.allclose(ours, hf, rtol=1e-6, atol=0), s
        enc = build("rope-ntk")
        enc.set_eval_length(int(s * T))
        assert torch.equal(enc.inv_freq, ours)
    assert ours[0] == 1.0 and ours[-1] < formula[-1] * 1.0001  # highest frequency kept, lowest interpolated


@pytest.mark.parametrize("name, rope_type, params", [
    ("rope-yarn", "yarn", {"original_max_position_embeddings": T}),
    ("rope-llama3", "llama3", {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": T}),
    ("rope-linear", "linear", {}),
])
@pytest.mark.parametrize("length", [96, 128, 256])
def test_frequencies_and_attention_scale_equal_transformers_rotary_embedding(name, rope_type, params, length):
    s = length / T
    hf = hf_rotary(rope_type, factor=s, **params)
    enc = build(name)
    enc.set_eval_length(length)
    assert torch.equal(enc.inv_freq, hf.inv_freq) and enc.attention_scale == pytest.approx(hf.attention_scaling)
    q = torch.randn(1, HEADS, length, HEAD_DIM)
    cos, sin = hf(q, torch.arange(length)[None])  # (1, L, D), already times attention_scaling
    ours_cos, ours_sin = rope_cos_sin(torch.arange(length), enc.inv_freq, enc.attention_scale)
    assert torch.allclose(ours_cos, cos[0], atol=1e-4) and torch.allclose(ours_sin, sin[0], atol=1e-4)


def test_yarn_temperature_is_applied_to_cos_and_sin_as_transformers_does():
    enc = build("rope-yarn")
    enc.set_eval_length(4 * T)
    assert enc.attention_scale == pytest.approx(0.1 * math.log(4) + 1)
    q = torch.randn(1, HEADS, 8, HEAD_DIM)
    qr, _ = enc.rotate(q, q, torch.arange(8))
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1) * enc.attention_scale, rtol=1e-5)


@pytest.mark.parametrize("length", [32, 64, 96, 256])
def test_dynamic_equals_rope_up_to_the_train_length_and_follows_the_window_length_beyond(length):
    hf = hf_rotary("dynamic", factor=2.0)
    q = torch.randn(1, HEADS, length, HEAD_DIM)
    cos, _ = hf(q, torch.arange(length)[None])  # transformers updates its frequencies for this length
    enc = build("rope-dynamic")
    enc.set_eval_length(length)
    assert torch.equal(enc.inv_freq, hf.inv_freq)
    plain = default_inv_freq(HEAD_DIM)[0]
    if length <= T:
        assert torch.equal(enc.inv_freq, plain)
    else:
        base = 10000.0 * (2.0 * length / T - 1) ** (HEAD_DIM / (HEAD_DIM - 2))
        assert torch.allclose(enc.inv_freq, default_inv_freq(HEAD_DIM, base)[0], rtol=1e-6)
        assert (enc.inv_freq[1:] < plain[1:]).all()


@pytest.mark.parametrize("name", FINETUNED)
def test_fine_tuned_variants_fix_their_scaling_at_the_fine_tune_length(name):
    enc = build(name)
    enc.set_train_length(4 * T)
    enc.set_eval_length(T)
    at_1x = enc.inv_freq.clone()
    enc.set_eval_length(4 * T)
    plain = default_inv_freq(HEAD_DIM)[0]
    if name == "rope-ft":
        assert torch.equal(at_1x, plain) and torch.equal(enc.inv_freq, plain)
    elif name == "rope-dynamic-ft":  # dynamic stays dynamic: plain at 1x, scaled at 4x
        assert torch.equal(at_1x, plain) and not torch.equal(enc.inv_freq, plain)
    else:  # s = 4 at every eval length, 1x included
        assert torch.equal(at_1x, enc.inv_freq) and not torch.equal(at_1x, plain)
        zero_shot = build(name.removesuffix("-ft"))
        zero_shot.set_eval_length(4 * T)
        assert torch.equal(zero_shot.inv_freq, enc.inv_freq)


def test_a_fixed_factor_from_the_config_and_what_it_changes():
    enc = build("rope-yarn", factor=2.0)
    enc.set_eval_length(T)  # fixed factor: scaled even at 1x
    assert enc.attention_scale == pytest.approx(0.1 * math.log(2) + 1)
    cfg = load_config(None, {"encodings": ["rope", "rope-yarn"], "model.encoding_options": {"rope-yarn": {"factor": 2}}})
    plain = RunConfig()
    assert cell_key(cfg, Row("rope"), 0, "fp") == cell_key(plain, Row("rope"), 0, "fp")  # same trained model
    assert eval_key(cfg, Row("rope-yarn")) != eval_key(plain, Row("rope-yarn"))  # other numbers: re-evaluated, not skipped
    with pytest.raises(ValueError, match="factor must be 0"):
        build("rope-ntk", factor=0.5)


@pytest.mark.parametrize("length", [T // 2, T, 3 * T // 2, 4 * T])
def test_rope_linear_honours_a_configured_factor_at_every_length(length):
    enc = build("rope-linear", factor=2.0)
    enc.set_eval_length(length)
    assert torch.equal(enc.inv_freq, default_inv_freq(HEAD_DIM)[0] / 2) and enc.attention_scale == 1.0


def test_rope_dynamic_ft_takes_its_factor_from_the_fine_tune_length_not_the_zero_shot_default():
    enc = build("rope-dynamic-ft")
    enc.set_train_length(4 * T)
    for length in (T, 2 * T, 4 * T, 8 * T):  # factor 4 (not rope-dynamic's default 2); still the window's length
        enc.set_eval_length(length)
        expected, scale = dynamic_frequencies(HEAD_DIM, 10000.0, 4.0, T, length)
        assert torch.equal(enc.inv_freq, expected) and enc.attention_scale == scale, length
    assert not torch.equal(enc.inv_freq, dynamic_frequencies(HEAD_DIM, 10000.0, 2.0, T, 8 * T)[0])


@pytest.mark.parametrize("name", [f"rope-{s.name}-ft" for s in SCALING_TABLE])
def test_a_configured_factor_on_a_fine_tuned_row_is_refused_naming_the_row(name):
    from posenc_bench.model.transformer import ModelConfig, build_encoding

    cfg = ModelConfig(encoding_options={name: {"factor": 2}})
    with pytest.raises(ConfigError, match=f"{name}.*finetune.len"):
        build_encoding(cfg, name, T)
    build_encoding(ModelConfig(), name, T)  # without the option it builds


def test_the_table_is_the_one_source_of_the_scalings():
    from posenc_bench.hf import rope as hf_rope

    names = [s.name for s in SCALING_TABLE]
    assert set(hf_rope.SCALINGS) <= set(names) and "ntk" not in hf_rope.SCALINGS
    assert hf_rope.SCALINGS == tuple(s.name for s in SCALING_TABLE if s.hf_rope_type)
    registered = encodings.available()
    for s in SCALING_TABLE:
        zero_shot, tuned = encodings.get_class(f"rope-{s.name}"), encodings.get_class(f"rope-{s.name}-ft")
        assert zero_shot.scaling is s and tuned.scaling is s and tuned.finetuned and not zero_shot.finetuned
    from posenc_bench.encodings.rope_fixes import PairwiseRoPE  # per-pair positions, not frequencies

    assert [n for n in registered if n.startswith("rope-") and n != "rope-ft"
            and encodings.get_class(n).trained_as == "rope"
            and not issubclass(encodings.get_class(n), PairwiseRoPE)] == \
        [f"rope-{n}" for n in names] + [f"rope-{n}-ft" for n in names]
    llama3 = encodings.get_class("rope-llama3").scaling
    assert hf_rope.LLAMA3_FREQ_FACTORS is LLAMA3_FREQ_FACTORS and llama3.hf_parameters == LLAMA3_FREQ_FACTORS
    params = hf_rope.scaling_parameters({"rope_theta": 10000.0}, "llama3", 4.0, T)
    assert {k: params[k] for k in LLAMA3_FREQ_FACTORS} == LLAMA3_FREQ_FACTORS
    # the factors rope-llama3 computes with are these: transformers' llama3 at them gives its frequencies
    enc = build("rope-llama3")
    enc.set_eval_length(4 * T)
    assert torch.equal(enc.inv_freq, hf_rotary("llama3", factor=4.0, original_max_position_embeddings=T,
                                                **LLAMA3_FREQ_FACTORS).inv_freq)


def test_yarn_defaults_are_the_authors_parameters_and_each_is_an_option():
    from posenc_bench.encodings.rope_scaling import YARN_PARAMETERS

    assert YARN_PARAMETERS == {"beta_fast": 32.0, "beta_slow": 1.0, "temperature_coef": 0.1}  # Peng et al.
    for name in ("rope-yarn", "rope-yarn-ft"):
        params = inspect.signature(encodings.get_class(name).__init__).parameters
        assert {k: params[k].default for k in YARN_PARAMETERS} == YARN_PARAMETERS, name
        assert build(name).parameters == YARN_PARAMETERS
    for name in ("rope-linear", "rope-llama3-ft", "rope-dynamic"):  # the other rows take none of them
        assert "beta_fast" not in inspect.signature(encodings.get_class(name).__init__).parameters
        with pytest.raises(ConfigError, match="beta_fast"):
            build(name, beta_fast=16.0)


@pytest.mark.parametrize("options", [{}, {"beta_fast": 16.0}, {"beta_slow": 2.0, "beta_fast": 8.0}])
@pytest.mark.parametrize("length", [128, 256])
def test_yarn_ramp_options_give_transformers_frequencies_for_those_parameters(options, length):
    enc = build("rope-yarn", **options)
    enc.set_eval_length(length)
    hf = hf_rotary("yarn", factor=length / T, original_max_position_embeddings=T, **options)
    assert torch.equal(enc.inv_freq, hf.inv_freq) and enc.attention_scale == hf.attention_scaling


@pytest.mark.parametrize("coef", [0.0, 0.1, 0.25])
def test_yarn_temperature_coefficient_sets_the_attention_scale(coef):
    enc = build("rope-yarn", temperature_coef=coef)
    enc.set_eval_length(4 * T)
    assert enc.attention_scale == pytest.approx(coef * math.log(4) + 1)
    enc.set_eval_length(T)
    assert enc.attention_scale == 1.0  # plain rope at 1x


def test_yarn_ramp_regions_for_our_head_size_at_train_length_512():
    """head_dim 32, theta 10000, L = 512: beta_fast = 32 rotations falls at pair 1.62 (floor 1), beta_slow = 1
    at pair 7.64 (ceil 8): pairs 0-1 keep their frequency, 8-15 are divided by s, 2-7 blend (the notes)."""
    enc = encodings.build("rope-yarn", d_model=128, n_heads=4, train_len=512)
    enc.set_eval_length(4 * 512)
    base, _ = default_inv_freq(32)
    ratio = (enc.inv_freq / base).double()  # 1: extrapolated, 1/s: interpolated
    assert torch.allclose(ratio[:2], torch.ones(2, dtype=torch.float64), rtol=1e-6)
    assert torch.allclose(ratio[8:], torch.full((8,), 0.25, dtype=torch.float64), rtol=1e-6)
    assert ((ratio[2:8] < 1) & (ratio[2:8] > 0.25)).all() and (ratio[2:8].diff() < 0).all()


@pytest.mark.parametrize("options,value", [({"beta_fast": 1.0}, "beta_fast=1.0"), ({"beta_slow": 0.0}, "beta_slow=0.0"),
                                           ({"temperature_coef": -0.1}, "-0.1")])
def test_bad_yarn_parameters_are_refused_naming_them(options, value):
    with pytest.raises(ValueError, match=value):
        build("rope-yarn", **options)


def test_yarn_options_change_the_numbers_not_the_trained_model():
    cfg = load_config(None, {"encodings": ["rope", "rope-yarn"],
                             "model.encoding_options": {"rope-yarn": {"beta_fast": 16}}})
    plain = RunConfig()
    assert cell_key(cfg, Row("rope"), 0, "fp") == cell_key(plain, Row("rope"), 0, "fp")
    assert eval_key(cfg, Row("rope-yarn")) != eval_key(plain, Row("rope-yarn"))
    assert encodings.get_class("rope-yarn").key_options(T, {"beta_fast": 16}) == {}


def test_yarn_tuning_grid_starts_at_the_authors_values_where_the_scaling_acts():
    from posenc_bench.encodings.rope_scaling import YARN_GRID

    cls = encodings.get_class("rope-yarn")
    grid = cls.tuning_grid(128, 512, {})
    assert grid[0] == {"beta_fast": 32.0, "beta_slow": 1.0} and grid[1] == {"beta_fast": 128.0, "beta_slow": 2.0}
    assert grid == [dict(p) for p in YARN_GRID] and len({tuple(p.values()) for p in grid}) == len(grid)
    for point in grid:
        build("rope-yarn", **point)  # each a valid option set
    assert cls.tuning_grid(128, 128, {}) == []  # plain rope at 1x with the default factor
    assert cls.tuning_grid(128, 128, {"factor": 2.0}) == grid  # a fixed factor scales at 1x too
    for name in ("rope-yarn-ft", "rope-linear", "rope-ntk", "rope"):  # no grid: fine-tuned, or nothing declared
        assert encodings.get_class(name).tuning_grid(128, 512, {}) == [], name
