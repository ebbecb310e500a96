"""The eval section (bench/config/eval.py): the protocol's choices, and which built-in configs score windows
inside documents."""

import pytest

from posenc_bench.bench.config import DEFAULT_EVAL_LENS, load_config
from posenc_bench.errors import ConfigError


def test_the_headline_config_scores_windows_inside_documents_and_the_others_the_stream():
    assert load_config("sotu-512").eval.windows == "documents"
    for name in ("default", "ci", "long-2048", "full"):
        assert load_config(name).eval.windows == "stream"


@pytest.mark.parametrize("overrides,match", [
    ({"eval.windows": "docs"}, "eval.windows 'docs' is not a choice; valid: stream, documents"),
    ({"eval.split": "heldout"}, "eval.split 'heldout' is not a split; valid splits: train, valid, test"),
    ({"eval.protocol": "sliding"}, "eval.protocol 'sliding' is not a protocol"),
    ({"eval.protocol": "strided"}, "the strided protocol needs a stride >= 1 token"),
    ({"eval.stride": 8}, "the strided protocol needs a stride >= 1 token"),
    ({"eval.tokens": 0}, "eval.tokens must be >= 1, got 0"),
    ({"eval.batch_tokens": -8}, "eval.batch_tokens must be >= 1, got -8"),
    ({"eval.position_buckets": 0}, "eval.position_buckets must be >= 1, got 0"),
    ({"eval.lens": ["abc"]}, "not a number"),
    ({"eval.key_tokens.stride": -1}, "eval.key_tokens.stride must be >= 0"),
    ({"eval.key_tokens.evaluator": "rope", "eval.key_tokens.short_context": "x"}, "valid: train, longppl"),
    ({"eval.key_tokens.evaluator": "nosuch"}, "nosuch"),
])
def test_values_no_evaluation_takes_are_refused_up_front(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/ci.yaml", overrides)


def test_the_default_lengths_are_the_default_runs():
    assert load_config("default").eval.lens == DEFAULT_EVAL_LENS == ["1x", "1.5x", "2x", "4x"]


def test_key_tokens_are_off_by_default_and_read_from_a_nested_section():
    assert load_config("ci").eval.key_tokens.evaluator == ""
    cfg = load_config("configs/ci.yaml", {"eval.key_tokens.evaluator": "rope-yarn", "eval.key_tokens.alpha": 1.5})
    rule = cfg.eval.key_tokens.rule()
    assert (rule.evaluator, rule.alpha, rule.beta, rule.short_context, rule.stride) == ("rope-yarn", 1.5, -2.0, "train",
                                                                                      None)
