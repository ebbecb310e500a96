"""Text through a Hugging Face tokenizer, with the UTF-8 bytes behind every token (for bits per byte).

Each document is preceded by one token, its prefix (``document_separator``; ``--doc-sep``): by default the
model's pretraining document separator, the token it saw between documents. It is context, never a scored
target (``separators``). Every token carries the bytes of text it covers (from the tokenizer's offsets; the
separator covers none), so bits per byte compare across tokenizers.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from posenc_bench.errors import ConfigError, DataError

# What ``--doc-sep`` takes besides a token of the tokenizer (``document_separator``).
PREFIXES = ("separator", "eos", "lm-eval", "none")

# The tokens model families put between pretraining documents where the tokenizer adds no BOS of its own: GPT-2's
# <|endoftext|> (also SmolLM/SmolLM2, StarCoder, GPT-NeoX/Pythia, Qwen2, OLMo) and Llama 3's <|end_of_text|>. An
# instruction-tuned release often names another token its eos, its chat end of turn (SmolLM2-Instruct:
# <|im_end|>), which the base model never saw between documents.
PRETRAINING_SEPARATORS = ("<|endoftext|>", "<|end_of_text|>")


def pretraining_separator(tokenizer) -> tuple[Optional[int], str]:
    """(the token the model saw between its pretraining documents, why), by a rule in this order:

    1. BOS where the tokenizer adds it itself (Llama 1/2, Mistral, Gemma, Llama 3: every pretraining text
       began with it);
    2. else the first of ``PRETRAINING_SEPARATORS`` that is a token of the tokenizer: SmolLM2 was pretrained
       with <|endoftext|> (id 0) between documents (HuggingFaceTB/SmolLM2-135M's config.json: bos_token_id =
       eos_token_id = 0; tokenizer_config.json: bos_token = eos_token = "<|endoftext|>"), while its Instruct
       tokenizer calls <|im_start|> its bos and <|im_end|> its eos;
    3. else EOS (GPT-2 style: the end of one document is the start of the next);
    4. else BOS; else none.
    """
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    probe = tokenizer("a")["input_ids"]
    if bos is not None and probe and probe[0] == bos:
        return bos, f"separator {tokenizer.bos_token!r} (bos: the tokenizer adds it)"
    vocab = tokenizer.get_vocab()
    for token in PRETRAINING_SEPARATORS:
        if token in vocab:
            return vocab[token], (f"separator {token!r} (between pretraining documents; eos is "
                                  f"{tokenizer.eos_token!r})")
    if eos is not None:
        return eos, f"separator {tokenizer.eos_token!r} (eos: no bos added, no {' or '.join(PRETRAINING_SEPARATORS)})"
    if bos is not None:
        return bos, f"separator {tokenizer.bos_token!r} (bos: the tokenizer has no eos)"
    return None, "none (the tokenizer has no bos or eos)"


def lm_eval_prefix(tokenizer) -> tuple[Optional[int], str]:
    """(the token lm-evaluation-harness puts before a document, why): HFLM.prefix_token_id
    (lm_eval/models/huggingface.py, EleutherAI/lm-evaluation-harness at 4e7e0d4), the tokenizer's bos id if it
    has one, else its eos id, whether or not the tokenizer adds it. ``loglikelihood_rolling`` scores a
    document in windows of the model's max length (lm_eval/utils.py, ``get_rolling_token_windows`` with
    context_len 1, then ``make_disjoint_window``): the first window is this token and the document's first
    max_len - 1 tokens, predicting its first max_len; each next window predicts the next max_len from the
    max_len tokens before them. Our windows are the same where a segment is one document from its start
    (``--long-docs``) and the lengths divide the segment (lm-eval's last, partial window keeps a full window
    of context; ours is partial). lm-eval tokenizes the text with the tokenizer's own special tokens: the same
    as ours for a tokenizer that adds none (SmolLM2, GPT-2); one that adds a BOS gets it twice there."""
    if tokenizer.bos_token_id is not None:
        return tokenizer.bos_token_id, f"lm-eval {tokenizer.bos_token!r} (HFLM prefix_token_id: bos)"
    if tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id, f"lm-eval {tokenizer.eos_token!r} (HFLM prefix_token_id: eos, no bos)"
    raise ConfigError("--doc-sep lm-eval: this tokenizer has no bos and no eos (lm-eval would have no prefix); "
                      f"give {', '.join(p for p in PREFIXES if p != 'lm-eval')} or a token")


def document_separator(tokenizer, choice: str = "separator") -> tuple[Optional[int], str]:
    """(token id put before every document or None, how it was chosen): ``choice`` is ``separator`` (the
    model's pretraining document separator, ``pretraining_separator``), ``eos`` (the tokenizer's eos: the
    former default where the tokenizer adds no BOS, SmolLM2-Instruct's chat end of turn), ``lm-eval``
    (``lm_eval_prefix``), ``none``, or a token of the tokenizer. The words start with the rule's name and the
    token, quoted, which ``recorded_separator`` reads back."""
    if choice == "none":
        return None, "none"
    if choice == "separator":
        return pretraining_separator(tokenizer)
    if choice == "lm-eval":
        return lm_eval_prefix(tokenizer)
    if choice == "eos":
        if tokenizer.eos_token_id is None:
            raise ConfigError(f"--doc-sep eos: this tokenizer has no eos token; give "
                              f"{', '.join(p for p in PREFIXES if p != 'eos')} or a token")
        return tokenizer.eos_token_id, f"eos {tokenizer.eos_token!r}"
    vocab = tokenizer.get_vocab()
    if choice not in vocab:
        raise ConfigError(f"--doc-sep {choice!r} is not a token of this tokenizer; give {', '.join(PREFIXES)}, or a "
                          f"token such as {', '.join(repr(t) for t in tokenizer.all_special_tokens[:5])}")
    return vocab[choice], f"{choice!r} (given)"


def recorded_separator(how: str) -> str:
    """The ``--doc-sep`` choice that gives again the separator a run recorded (``document_separator``'s second
    value, the run's ``doc_separator``, older runs' "bos '<s>' (...)" and "eos '</s>' (...)" too): the token
    itself, named, so that a tokenizer read by another release (which may name another token its eos) still
    puts the same token between documents; "none" for none."""
    import ast
    import re

    if how.startswith("none"):
        return "none"
    quoted = re.match(r"^(?:bos |eos |separator |lm-eval )?('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", how)
    if quoted is None:
        raise ConfigError(f"doc_separator {how!r} is not one that document_separator records (separator '<s>' "
                          "(...), eos '<eos>', lm-eval '<s>' (...), '<token>' (given), none)")
    return ast.literal_eval(quoted.group(1))


def separators(index: torch.Tensor, sep: Optional[int]) -> torch.Tensor:
    """(T,) bool: the separators of a stream of ``tokenize_documents`` (``index``: its document index per token),
    each its document's first token; none without a separator. They are context only, never scored: a
    perplexity of the documents' text, not of where one ends (and which token marks it)."""
    if sep is None or index.numel() == 0:
        return torch.zeros_like(index, dtype=torch.bool)
    opens = torch.ones_like(index, dtype=torch.bool)
    opens[1:] = index[1:] != index[:-1]
    return opens


def token_bytes_of(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """UTF-8 bytes of ``text`` behind each token: token i covers characters [start_i, start_{i+1}) (the first
    from 0, the last to the end), so the tokens of a document cover its bytes exactly once."""
    n = len(text)
    starts, last = [], 0
    for i, (s, _) in enumerate(offsets):
        last = 0 if i == 0 else min(n, max(last, s))
        starts.append(last)
    bounds = starts + [n]
    if text.isascii():
        return [bounds[i + 1] - bounds[i] for i in range(len(starts))]
    byte_at = [0] * (n + 1)
    for i, ch in enumerate(text):
        byte_at[i + 1] = byte_at[i] + len(ch.encode("utf-8", errors="replace"))
    return [byte_at[bounds[i + 1]] - byte_at[bounds[i]] for i in range(len(starts))]


def _documents(tokenizer, docs: list[tuple[str, bytes]], sep: Optional[int]) -> Iterator[tuple[list[int], list[int]]]:
    """(token ids, bytes per token) of each document in order, the separator first (0 bytes)."""
    from transformers.utils import logging as hf_logging

    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer: bits per byte need its "
                          "character offsets (install `tokenizers`, or convert the tokenizer)")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "sequence longer than model_max_length": we cut windows ourselves
    try:
        for name, raw in docs:
            text = raw.decode("utf-8", errors="replace")
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            counts = token_bytes_of(text, enc["offset_mapping"])
            if sum(counts) != len(text.encode("utf-8")) and enc["input_ids"]:
                raise DataError(f"token offsets of document {name!r} do not cover its text")
            head = [] if sep is None else [sep]
            yield head + list(enc["input_ids"]), [0] * len(head) + counts
    finally:
        hf_logging.set_verbosity(verbosity)


def tokenize_documents(tokenizer, docs: list[tuple[str, bytes]], sep: Optional[int], min_tokens: int,
                       min_doc_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, bytes per token, document index per token), 1-D int64: [sep] + doc tokens for documents in
    order, until at least ``min_tokens`` tokens (or all documents). The separator covers 0 bytes and belongs
    to the document it opens. With ``min_doc_tokens``, shorter documents (separator included) are left out."""
    ids: list[int] = []
    nbytes: list[int] = []
    index: list[int] = []
    for i, (doc_ids, counts) in enumerate(_documents(tokenizer, docs, sep)):
        if len(doc_ids) < min_doc_tokens:
            continue
        ids.extend(doc_ids)
        nbytes.extend(counts)
        index.extend([i] * len(doc_ids))
        if len(ids) >= min_tokens:
            break
    return (torch.tensor(ids, dtype=torch.int64), torch.tensor(nbytes, dtype=torch.int64),
            torch.tensor(index, dtype=torch.int64))
