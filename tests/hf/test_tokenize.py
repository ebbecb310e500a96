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
