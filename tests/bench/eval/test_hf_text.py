"""A Hugging Face model's eval text (bench/eval/hf_text.py): the scored split and, for `eval --tune`, the valid
split cut the same way, never sharing a document."""

import pytest

from posenc_bench.bench.eval.hf_text import TUNED_SPLITS, hf_text, valid_text
from posenc_bench.data import load_corpus
from posenc_bench.errors import ConfigError


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("stdlib")


def test_all_but_valid_is_every_document_but_the_valid_ones(corpus):
    names = {s: [n for n, _ in corpus.documents(s)] for s in ("all", "all-but-valid", "valid", "test", "train")}
    assert names["all-but-valid"] == names["test"] + names["train"]
    assert set(names["all-but-valid"]) | set(names["valid"]) == set(names["all"])
    assert not set(names["all-but-valid"]) & set(names["valid"])


@pytest.mark.parametrize("split", TUNED_SPLITS)
def test_valid_text_is_cut_as_the_scored_text_from_other_documents(hf_model, corpus, split):
    scored = hf_text(hf_model.tokenizer, corpus, 64, 256, split=split, long_docs=True, doc_sep="separator")
    valid = valid_text(hf_model.tokenizer, corpus, 64, 256, split=split, long_docs=True, doc_sep="separator")
    assert scored.segments.shape == valid.segments.shape == (4, 65)
    assert valid.separator == scored.separator and valid.separator_how == scored.separator_how
    valid_names = {n for n, _ in corpus.documents("valid")}
    assert set(valid.documents) <= valid_names and not set(scored.documents) & valid_names
    assert sum(valid.documents.values()) == int(valid.target_mask[:, 1:].sum()) == 256


@pytest.mark.parametrize("split", ["all", "valid"])
def test_valid_text_refuses_a_scored_split_that_holds_the_valid_documents(hf_model, corpus, split):
    with pytest.raises(ConfigError, match=f"--tune chooses on the valid split.*got '{split}'"):
        valid_text(hf_model.tokenizer, corpus, 64, 256, split=split, long_docs=False, doc_sep="separator")
