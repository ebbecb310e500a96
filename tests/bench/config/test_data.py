"""The data section (bench/config/data.py): its split fractions, and the corpus a run reads with its tokenizer."""

import pytest

from posenc_bench.bench.config import load_config, load_run_corpus
from posenc_bench.errors import ConfigError


@pytest.mark.parametrize("overrides", [{"data.test_fraction": 0}, {"data.valid_fraction": -0.1},
                                       {"data.valid_fraction": 0.5, "data.test_fraction": 0.5}])
def test_fractions_that_leave_no_train_split_are_refused(overrides):
    with pytest.raises(ConfigError, match="data.valid_fraction and data.test_fraction must be fractions"):
        load_config("ci", overrides)


def test_the_run_corpus_is_the_sections_source_split_as_it_says():
    corpus = load_run_corpus(load_config("ci"))
    assert set(corpus.splits) == {"train", "valid", "test"} and corpus.splits["test"]
    assert corpus.tokenizer.name == "bytes"
