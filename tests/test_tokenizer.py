"""The tokenizers of our models: bytes and a byte-level BPE trained on the train split (posenc_bench/tokenizer.py)."""

import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch

from posenc_bench.errors import ConfigError
from posenc_bench.tokenizer import BPETokenizer, ByteTokenizer, file_name, load_tokenizer, parse_tokenizer

TEXTS = [
    "The State of the Union is strong. We have met the challenge, and the Congress has acted.\n" * 3,
    "Fellow-Citizens of the Senate and House of Representatives: déjà vu, naïve café, 1,234.56 dollars.\n",
    "def f(x):\n    return x ** 2  # a square\n\n\nclass A:\n    pass\n",
]


def stdlib_texts(n=40):
    """Real text that ships with every Python: the first ``n`` modules of the standard library, by name."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n]
    return [f.read_bytes() for f in files]


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(stdlib_texts() + [t.encode() for t in TEXTS], 600)


def test_specs_parse_and_bad_ones_name_the_valid_forms():
    assert parse_tokenizer("bytes") is None and parse_tokenizer("bpe-4096") == 4096
    for bad in ("bpe", "bpe-10", "bpe-40000", "wordpiece", "BPE-4096"):
        with pytest.raises(ConfigError, match="valid: bytes, bpe-<vocab>"):
            parse_tokenizer(bad)


@pytest.mark.parametrize("text", TEXTS + ["", "\x00\x7f tabs\tand\r\nreturns", "漢字 and emoji 🙂"])
def test_bpe_round_trips_and_its_tokens_cover_every_byte_once(bpe, text):
    raw = text.encode("utf-8")
    (ids,) = bpe.encode_documents([raw])
    assert ids.dtype == torch.int16 and (ids >= 0).all() and (ids < bpe.vocab_size).all()
    assert bpe.decode(ids.tolist()) == raw
    assert int(bpe.token_bytes()[ids.long()].sum()) == len(raw)  # bits per byte count each byte once
    assert bpe.bos not in ids.tolist()


def test_bpe_compresses_and_bos_covers_no_bytes(bpe):
    raw = TEXTS[0].encode()
    (ids,) = bpe.encode_documents([raw])
    assert len(raw) / ids.numel() > 1.5  # merges learned: more than a byte a token
    table = bpe.token_bytes()
    assert table.shape == (600,) and table[bpe.bos] == 0 and bpe.bos == 0
    assert (table[1:257] == 1).all()  # the 256 byte symbols come first, one byte each
    assert bpe.decode([bpe.bos, *ids.tolist()]) == raw


def test_the_same_split_gives_the_same_tokenizer_and_another_vocab_another(bpe):
    texts = stdlib_texts() + [t.encode() for t in TEXTS]
    again = BPETokenizer.train(texts, 600)
    assert again.json == bpe.json and again.fingerprint == bpe.fingerprint
    other = BPETokenizer.train(texts, 700)
    assert other.fingerprint != bpe.fingerprint and other.name == "bpe-700"
    assert BPETokenizer.train(texts[:20], 600).fingerprint != bpe.fingerprint  # other text, other merges


def test_bytes_tokenizer_is_the_former_encoding():
    tok = ByteTokenizer()
    (ids,) = tok.encode_documents(["é!".encode()])
    assert ids.tolist() == [0xC3, 0xA9, 0x21] and tok.decode([256, *ids.tolist()]) == "é!".encode()
    table = tok.token_bytes()
    assert table.shape == (257,) and table[256] == 0 and int(table.sum()) == 256
    assert tok.encode_documents([b""])[0].numel() == 0


def test_a_folder_keeps_the_tokenizer_and_later_readers_load_it_without_training(tmp_path, bpe):
    texts = stdlib_texts() + [t.encode() for t in TEXTS]
    first = load_tokenizer("bpe-600", lambda: texts, tmp_path)
    assert (tmp_path / file_name("bpe-600")).is_file() and first.fingerprint == bpe.fingerprint

    def no_training():
        raise AssertionError("trained again although the folder holds the tokenizer")

    again = load_tokenizer("bpe-600", no_training, tmp_path)
    assert again.fingerprint == first.fingerprint
    assert load_tokenizer("bpe-600", lambda: texts, tmp_path / "other", save=False).fingerprint == first.fingerprint
    assert not (tmp_path / "other").exists()  # save=False writes nothing
    assert isinstance(load_tokenizer("bytes", no_training, tmp_path), ByteTokenizer)


def test_corpus_fingerprint_holds_the_bpe_and_bytes_keep_theirs(bpe):
    from posenc_bench.data import Corpus

    corpus = Corpus("t", {"train": [("a", TEXTS[0].encode())], "valid": [], "test": [("b", TEXTS[1].encode())]}, "f" * 16)
    same = corpus.with_tokenizer(ByteTokenizer())
    assert same.fingerprint == corpus.fingerprint and "tokenizer" not in same.describe()
    read = corpus.with_tokenizer(bpe)
    assert read.fingerprint != corpus.fingerprint and read.describe()["text_fingerprint"] == corpus.fingerprint
    assert read.describe()["tokenizer"]["fingerprint"] == bpe.fingerprint
    assert read.with_tokenizer(ByteTokenizer()).fingerprint == corpus.fingerprint  # back to the text's own
    (name, tokens), = read.document_tokens("test")
    assert name == "b" and tokens[0] == bpe.bos and bpe.decode(tokens.tolist()) == TEXTS[1].encode()


def test_bits_per_byte_of_a_bpe_model_count_the_bytes_of_text(tmp_path, bpe):
    """A model evaluated on BPE tokens: bpb = NLL / ln 2 / the bytes behind the targets, which are the bytes of
    the text the targets decode to (BOS none), and ppl is per token."""
    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.eval.evaluate import EvalSet, evaluate_model
    from posenc_bench.bench.run.runtime import Runtime
    from posenc_bench.data import Corpus
    from posenc_bench.model.transformer import DecoderLM, ModelConfig

    docs = [(f"d{i}", t) for i, t in enumerate(stdlib_texts(12))]
    corpus = Corpus("t", {"train": docs[:6], "valid": [], "test": docs[6:]}, "f" * 16).with_tokenizer(bpe)
    cfg = RunConfig(encodings=["rope"])
    cfg.train.train_len, cfg.eval.tokens, cfg.eval.lens = 32, 2048, ["1x", "2x"]
    evalset = EvalSet.for_run(cfg, corpus)
    assert evalset.meta()["tokenizer"] == {"name": "bpe-600", "fingerprint": bpe.fingerprint}
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2, vocab_size=600), "rope", train_len=32)
    rt = Runtime.create("cpu", "fp32", show_progress=False)
    result = evaluate_model(model, evalset, 32, rt)
    targets = evalset.segments[:, 1:]
    text = b"".join(bpe.decode(row.tolist()) for row in targets)
    assert result["bytes"] == len(text) == evalset.meta()["eval_bytes"] and result["tokens"] == targets.numel()
    assert result["bpb"] == pytest.approx(result["loss"] * result["tokens"] / math.log(2) / len(text), rel=1e-12)
    assert result["ppl"] == pytest.approx(math.exp(result["loss"]), rel=1e-12)


def test_config_sizes_the_model_to_the_tokenizer_and_refuses_a_vocab_too_small():
    from posenc_bench.bench.config import load_config

    assert load_config("ci", {"data.tokenizer": "bpe-1024"}).model.vocab_size == 1024
    assert load_config("ci", {"data.tokenizer": "bpe-1024", "model.vocab_size": 2000}).model.vocab_size == 2000
    assert load_config("ci").model.vocab_size == 257
    with pytest.raises(ConfigError, match="model.vocab_size must be at least 1024"):
        load_config("ci", {"data.tokenizer": "bpe-1024", "model.vocab_size": 600})


def test_cell_keys_of_byte_runs_are_unchanged_and_a_bpe_changes_them():
    """Keys made before the tokenizer was a choice stay valid (checkpoints reusable); a BPE run's differ."""
    from posenc_bench.bench.config import load_config
    from posenc_bench.bench.keys import cell_key
    from posenc_bench.bench.rows import Row

    cfg = load_config("ci")
    key = cell_key(cfg, Row.parse("rope"), 0, "f" * 16)
    assert key == "1f7ebbcf7b41d28f"  # the key of this cell before data.tokenizer existed (92123e2)
    assert cell_key(load_config("ci", {"data.tokenizer": "bpe-1024"}), Row.parse("rope"), 0, "f" * 16) != key


def test_a_run_keeps_its_bpe_resumes_with_it_and_refuses_another_vocab(tmp_path, capsys):
    from posenc_bench.commands.cli import main
    from tests.commands.cli_helpers import run

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(stdlib_texts(60)):
        (corpus / f"m{i:02d}.txt").write_bytes(text)
    args = ["--encodings", "rope", "--data", str(corpus / "*.txt"), "--set", "data.tokenizer=bpe-512"]
    assert run(tmp_path, *args) == 0
    out = tmp_path / "out"
    data = json.loads((out / "results.json").read_text())
    tok = BPETokenizer.from_json((out / file_name("bpe-512")).read_text(), 512)
    assert data["run"]["tokenizer"] == {"name": "bpe-512", "fingerprint": tok.fingerprint}
    assert data["run"]["config"]["model"]["vocab_size"] == 512
    assert data["run"]["corpus"]["tokenizer"]["fingerprint"] == tok.fingerprint
    rec = data["records"][0]
    assert 1.5 < rec["bytes"] / rec["tokens"] < 6  # several bytes a token, counted from the BPE's table
    ckpt_meta = json.loads((out / "checkpoints" / "rope-seed0" / "config.json").read_text())
    assert ckpt_meta["tokenizer"]["fingerprint"] == tok.fingerprint
    assert "Byte-level BPE (bpe-512" in (out / "table.md").read_text()
    capsys.readouterr()
    assert run(tmp_path, *args) == 0
    assert "done before, skipped" in capsys.readouterr().out
    assert run(tmp_path, *args[:-1], "data.tokenizer=bpe-600") == 2
    assert "vocab_size: 512 there, 600 now" in capsys.readouterr().err
    # merge keeps the BPE beside the merged results, and says so when no input folder holds it
    assert main(["merge", str(out), "--out", str(tmp_path / "merged")]) == 0
    assert BPETokenizer.from_json((tmp_path / "merged" / file_name("bpe-512")).read_text(), 512).json == tok.json
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "results.json").write_bytes((out / "results.json").read_bytes())
    capsys.readouterr()
    assert main(["merge", str(alone), "--out", str(tmp_path / "merged-alone")]) == 0
    assert "no input folder holds the bpe-512" in capsys.readouterr().err
    assert not (tmp_path / "merged-alone" / file_name("bpe-512")).exists()
    assert main(["eval", "--model", str(out / "checkpoints" / "rope-seed0"), "--eval-tokens", "512",
                 "--out", str(tmp_path / "ev"), "--progress", "off"]) == 0  # the checkpoint's BPE, from its folder
    ev = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert ev["run"]["tokenizer"]["fingerprint"] == tok.fingerprint
    assert main(["passkey", "--model", str(out / "checkpoints" / "rope-seed0"), "--lengths", "256", "--depths", "0.5",
                 "--trials", "1", "--out", str(tmp_path / "pk")]) == 0  # prompts in the checkpoint's BPE tokens
    passkey = json.loads((tmp_path / "pk" / "passkey.json").read_text())
    assert [r["length"] for r in passkey["records"]] == [256]
    (out / file_name("bpe-512")).write_text(BPETokenizer.train(stdlib_texts(5), 512).json)  # another BPE there
    capsys.readouterr()
    assert main(["eval", "--model", str(out / "checkpoints" / "rope-seed0"), "--out", str(tmp_path / "ev2"),
                 "--progress", "off"]) == 2
    assert "was trained with tokenizer" in capsys.readouterr().err
    assert main(["merge", str(out), "--out", str(tmp_path / "merged-other")]) == 2  # not the BPE of its results
    assert f"but the results were made with {tok.fingerprint}" in capsys.readouterr().err
