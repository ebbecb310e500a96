"""What a sweep trains on and scores: text or a task, chosen by the config (posenc_bench/bench/work.py)."""

import pytest
import torch

from posenc_bench.bench import work
from posenc_bench.bench.config import load_config
from posenc_bench.data import TrainBatches
from posenc_bench.errors import DataError


def test_text_work_is_the_corpus_its_eval_set_and_the_seeded_batches(tmp_path):
    for i in range(12):
        (tmp_path / f"d{i:02d}.txt").write_text(f"document {i} " * 300)
    cfg = load_config("ci", {"data.source": str(tmp_path / "*.txt"), "train.train_len": 32, "eval.tokens": 512})
    text = work.for_run(cfg)
    assert isinstance(text, work.TextWork) and text.metric == "ppl" and text.train_len == 32
    assert text.lengths == cfg.eval_lengths() and text.fingerprint == text.corpus.fingerprint
    expected = TrainBatches(text.corpus.stream("train"), 32, cfg.train.batch_size, 3)
    assert torch.equal(text.batches(3).next(), expected.next())
    assert set(text.meta()) >= {"segments", "corpus", "eval_documents"} and text.tokenizer() is None


def test_a_task_config_gives_a_task_work():
    task = work.for_run(load_config("tasks-ci", {"task.train_size": 6, "task.eval_instances": 8}))
    assert task.metric == "accuracy" and task.train_len == 6 and task.lengths == [6, 9, 12, 24]
    assert {len(v) for v in task.instances.values()} == {8} and task.meta()["corpus"]["source"] == "task:copy"


def test_a_train_split_too_short_for_one_window_is_refused_before_any_work(tmp_path):
    for i in range(40):
        (tmp_path / f"d{i:02d}.txt").write_text("x" * 20)
    cfg = load_config("ci", {"data.source": str(tmp_path / "*.txt"), "train.train_len": 4096, "eval.tokens": 8})
    from posenc_bench.bench.config import load_run_corpus

    with pytest.raises(DataError, match=r"its train split has \d+ tokens .* fewer than 4098 \(train length \+ 2\)"):
        work.check_train_split(cfg, load_run_corpus(cfg))


def test_the_valid_set_is_the_valid_split_cut_as_the_eval_set(tmp_path):
    for i in range(60):
        (tmp_path / f"d{i:02d}.txt").write_text(f"document {i} " * 300)
    cfg = load_config("ci", {"data.source": str(tmp_path / "*.txt"), "train.train_len": 32, "eval.tokens": 512})
    text = work.for_run(cfg)
    valid = text.valid()
    assert valid is text.valid() and valid.segments.shape == text.evalset.segments.shape  # built once, cut alike
    assert not torch.equal(valid.segments, text.evalset.segments)
    assert set(valid.documents).isdisjoint(text.evalset.documents)  # no test document is looked at
    assert set(valid.documents) <= {name for name, _ in text.corpus.splits["valid"]}
    meta = text.valid_meta()
    assert meta["split"] == "valid" and meta["targets"] == valid.segments[:, 1:].numel() >= 512
    assert len(meta["fingerprint"]) == 16
