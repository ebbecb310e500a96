"""The model section's checks (bench/config/model.py): encoding options, the vocabulary, every row's shape."""

import pytest

from posenc_bench.bench.config import load_config
from posenc_bench.errors import ConfigError


@pytest.mark.parametrize("overrides,match", [
    ({"model.vocab_size": 100}, "vocab_size must be at least 257"),
    ({"model.encoding_options": {"rope": [1]}}, "must be a mapping of options"),
    ({"model.encoding_options": {"rope-linear": {"theta": 5e5}}}, "rope-linear.theta: 'rope-linear' evaluates the trained 'rope' model and takes its theta; set it under model.encoding_options.rope"),
    ({"model.encoding_options": {"t5": {"num_buckets": 1}}}, "num_buckets >= 2"),
    ({"model.encoding_options": {"t5": {"num_buckets": 32, "max_distance": 10}}}, "max_distance > num_buckets"),
    ({"model.encoding_options": {"rope": {"theta": "lots"}}}, "must be a number"),
    ({"encodings": ["rope+rand"], "model.encoding_options": {"rope+rand": {"eval_positions": "sorted"}}},
     "eval_positions must be one of random, ordered"),
    ({"encodings": ["rope+sink4"]}, r"row 'rope\+sink4': .*attention sinks need a sliding window"),
    ({"data.tokenizer": "bpe-512", "model.vocab_size": 257}, r"vocab_size must be at least 512 .*bpe-512"),
    ({"data.tokenizer": "bpe-300"}, r"data.tokenizer .bpe-300. is not a tokenizer"),
])
def test_values_that_would_crash_later_are_refused_up_front(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/ci.yaml", overrides)


def test_the_models_default_vocabulary_is_the_byte_corpus_vocabulary():
    """model/ does not import data.py (imports go one way); the two numbers are kept equal here."""
    from posenc_bench.data import VOCAB_SIZE
    from posenc_bench.model.transformer import ModelConfig

    assert ModelConfig().vocab_size == VOCAB_SIZE == 257
    with pytest.raises(ConfigError, match="model.vocab_size must be at least 257"):
        load_config(None, {"model.vocab_size": 256})
