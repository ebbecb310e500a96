"""Tokenizing a corpus with a Hugging Face tokenizer (hf/tokenize.py): every document once, behind its separator,
with the bytes each token covers."""

from posenc_bench.hf import tokenize as hf_tokenize


def test_tokenization_covers_each_document_once_with_its_bytes(tokenizer):
    docs = [("a.py", "def f(x):\n    return x  # café ü\n".encode()), ("b.py", b"import os\n\nprint(os.sep)\n")]
    tokens, nbytes, _ = hf_tokenize.tokenize_documents(tokenizer, docs, tokenizer.bos_token_id, min_tokens=10**6)
    expected = []
    for _, text in docs:
        expected += [tokenizer.bos_token_id] + tokenizer(text.decode(), add_special_tokens=False)["input_ids"]
    assert tokens.tolist() == expected
    assert int(nbytes.sum()) == sum(len(t) for _, t in docs)  # every byte once; separators cover none
    assert int(nbytes[tokens == tokenizer.bos_token_id].sum()) == 0
    assert (nbytes >= 0).all()


def test_the_recorded_separator_names_the_same_token_again(tokenizer):
    """A run records how its separator was chosen (``document_separator``'s words); ``recorded_separator`` gives
    the --doc-sep that puts the same token between documents, whatever another release calls eos."""
    import pytest

    from posenc_bench.errors import ConfigError

    for choice in ("auto", "</s>", "<s>", "none"):
        sep, how = hf_tokenize.document_separator(tokenizer, choice)
        assert hf_tokenize.document_separator(tokenizer, hf_tokenize.recorded_separator(how))[0] == sep, how
    assert hf_tokenize.recorded_separator("eos '<|im_start|>' (between documents, GPT-2 style)") == "<|im_start|>"
    assert hf_tokenize.recorded_separator("bos \"it's\" (the tokenizer adds it)") == "it's"
    assert hf_tokenize.recorded_separator("none (the tokenizer has no bos or eos)") == "none"
    with pytest.raises(ConfigError, match="doc_separator 'whatever' is not one that document_separator records"):
        hf_tokenize.recorded_separator("whatever")
