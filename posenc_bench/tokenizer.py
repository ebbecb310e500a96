"""Tokenizers of our models (``data.tokenizer``): bytes (the default) or a byte-level BPE trained on the train split.

- ``bytes``: the 256 byte values plus BOS (256); every token is one byte of text, BOS none.
- ``bpe-<vocab>``: a byte-level BPE (GPT-2's scheme: Radford et al. 2019, sec. 2.2; Sennrich et al. 2016) of
  ``vocab`` tokens, BOS (``<|bos|>``, id 0) and the 256 byte symbols among them, trained with Hugging Face
  ``tokenizers`` on the run's train split only, so no held-out text shapes the vocabulary. Every token stands
  for a whole number of bytes (its byte-level symbols, one per byte), so bits per byte stay comparable with
  the byte tokenizer's; eval lengths stay in tokens.

A run trains its BPE once and keeps it in its results folder (``tokenizer-bpe-<vocab>.json``, written
atomically); resume, checkpoint eval, passkey and the shards of a sweep load it from there. The tokenizer's fingerprint (of its
serialized form) is part of the corpus fingerprint, and so of every cell key, the eval fingerprint and the
folder's identity: results made with another vocabulary, or with another BPE of the same size, are refused
as incomparable instead of mixed.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol

import torch

from posenc_bench.errors import ConfigError, DataError
from posenc_bench.files import atomic_write_text

BYTE_BOS = 256
BYTE_VOCAB = 257
BPE_BOS_TOKEN = "<|bos|>"
MIN_BPE_VOCAB, MAX_BPE_VOCAB = 512, 32768  # 256 byte symbols + BOS + merges; ids stored as int16
_BPE = re.compile(r"bpe-(\d+)")


class Tokenizer(Protocol):
    name: str  # "bytes" | "bpe-<vocab>"
    vocab_size: int
    bos: int
    fingerprint: Optional[str]  # None for bytes, whose results predate tokenizers and keep their fingerprints

    def encode_documents(self, texts: list[bytes]) -> list[torch.Tensor]: ...
    def decode(self, ids: Iterable[int]) -> bytes: ...
    def token_bytes(self) -> torch.Tensor: ...  # (vocab_size,) int64: bytes of text behind each token id
    def describe(self) -> dict: ...


def parse_tokenizer(spec: str) -> Optional[int]:
    """None for ``bytes``, the vocabulary size for ``bpe-<vocab>``; ConfigError naming the valid forms else."""
    if spec == "bytes":
        return None
    m = _BPE.fullmatch(str(spec))
    if m and MIN_BPE_VOCAB <= int(m.group(1)) <= MAX_BPE_VOCAB:
        return int(m.group(1))
    raise ConfigError(f"data.tokenizer {spec!r} is not a tokenizer; valid: bytes, bpe-<vocab> with vocab "
                      f"{MIN_BPE_VOCAB}..{MAX_BPE_VOCAB} (e.g. bpe-4096)")


def file_name(spec: str) -> str:
    """The file a results folder keeps its tokenizer in (``tokenizer-bpe-4096.json``)."""
    return f"tokenizer-{spec}.json"


def vocab_size_of(spec: str) -> int:
    """The model vocabulary a tokenizer spec needs (257 for bytes)."""
    return parse_tokenizer(spec) or BYTE_VOCAB


class ByteTokenizer:
    """Bytes 0..255 and BOS = 256."""

    name, vocab_size, bos, fingerprint = "bytes", BYTE_VOCAB, BYTE_BOS, None

    def encode_documents(self, texts: list[bytes]) -> list[torch.Tensor]:
        """int16 ids of each text (no BOS; ``Corpus`` puts it before every document)."""
        return [torch.frombuffer(bytearray(t), dtype=torch.uint8).to(torch.int16) if t
                else torch.zeros(0, dtype=torch.int16) for t in texts]  # frombuffer refuses an empty buffer

    def decode(self, ids: Iterable[int]) -> bytes:
        return bytes(i for i in ids if i != BYTE_BOS)

    def token_bytes(self) -> torch.Tensor:
        out = torch.ones(BYTE_VOCAB, dtype=torch.int64)
        out[BYTE_BOS] = 0
        return out

    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}


class BPETokenizer:
    """A byte-level BPE (``tokenizers``' BPE model, ByteLevel pre-tokenizer and decoder, GPT-2's split regex)."""

    def __init__(self, hf, vocab_size: int) -> None:
        self.hf, self.vocab_size = hf, vocab_size
        self.name = f"bpe-{vocab_size}"
        self.bos = hf.token_to_id(BPE_BOS_TOKEN)
        if self.bos is None or hf.get_vocab_size() > vocab_size:
            raise DataError(f"tokenizer file is not a {self.name} of posenc-bench: it has {hf.get_vocab_size()} tokens "
                            f"and {'a' if self.bos is not None else 'no'} {BPE_BOS_TOKEN} token")
        self.json = hf.to_str()
        self.fingerprint = hashlib.sha256(self.json.encode()).hexdigest()[:16]

    @classmethod
    def train(cls, texts: Iterable[bytes], vocab_size: int) -> "BPETokenizer":
        """Trained on ``texts`` (UTF-8; undecodable bytes become U+FFFD): deterministic for the same texts,
        vocabulary and ``tokenizers`` version."""
        from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BPE_BOS_TOKEN], min_frequency=0,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        hf.train_from_iterator((t.decode("utf-8", errors="replace") for t in texts), trainer=trainer)
        return cls(hf, vocab_size)

    @classmethod
    def from_json(cls, text: str, vocab_size: int) -> "BPETokenizer":
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same data error
            raise DataError(f"tokenizer file is not a tokenizers JSON file: {e}") from None
        return cls(hf, vocab_size)

    def encode_documents(self, texts: list[bytes]) -> list[torch.Tensor]:
        encoded = self.hf.encode_batch([t.decode("utf-8", errors="replace") for t in texts], add_special_tokens=False)
        return [torch.tensor(e.ids, dtype=torch.int16) for e in encoded]

    def decode(self, ids: Iterable[int]) -> bytes:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True).encode("utf-8")

    def token_bytes(self) -> torch.Tensor:
        """Each byte-level symbol is one byte, so a token covers as many bytes as its string has characters;
        BOS (a special token) covers none. Ids the trainer did not fill (a small corpus) cover none."""
        out = torch.zeros(self.vocab_size, dtype=torch.int64)
        for token, i in self.hf.get_vocab(with_added_tokens=False).items():
            out[i] = len(token)
        out[self.bos] = 0
        return out

    def describe(self) -> dict:
        import tokenizers

        return {"name": self.name, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint,
                "trained_tokens": self.hf.get_vocab_size(), "library": f"tokenizers {tokenizers.__version__}"}


def keep_tokenizer(folder: Path | str, tok: Tokenizer) -> None:
    """Write a BPE into ``folder`` (atomically) unless it is there already; bytes need no file."""
    if tok.fingerprint is not None and not (Path(folder) / file_name(tok.name)).is_file():
        atomic_write_text(Path(folder) / file_name(tok.name), tok.json)


def load_tokenizer(spec: str, train_texts: Callable[[], Iterable[bytes]], folder: Optional[Path | str] = None,
                   save: bool = True) -> Tokenizer:
    """The tokenizer ``spec`` names: bytes; or the BPE kept in ``folder`` (``file_name(spec)``); or, when the
    folder has none, one trained on ``train_texts()`` and (``save``) written there for every later reader."""
    vocab = parse_tokenizer(spec)
    if vocab is None:
        return ByteTokenizer()
    path = Path(folder) / file_name(spec) if folder is not None else None
    if path is not None and path.is_file():
        return BPETokenizer.from_json(path.read_text(), vocab)
    tok = BPETokenizer.train(train_texts(), vocab)
    if path is not None and save:
        keep_tokenizer(path.parent, tok)
    return tok
