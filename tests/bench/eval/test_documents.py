"""The documents of the units of results made before units recorded them (bench/eval/documents.py): a fresh run's
``units["doc"]`` is what the backfill rebuilds, in both windows modes; another text is refused and nothing is
written; a folder that has them, or a task's, is left alone; ``from_metadata`` derives the same documents."""

import json
import shutil
from pathlib import Path

import pytest

from posenc_bench.bench.eval.documents import (DocumentsError, backfill, from_run_metadata, text_records,
                                               without_documents)
from posenc_bench.bench.eval.evaluate import unit_documents
from posenc_bench.commands.cli import main

ROOT = Path(__file__).resolve().parents[3]
MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "32", "--steps", "4", "--eval-tokens", "1024",
         "--progress", "off", "--encodings", "rope", "--eval-lens", "1,2x", "--set", "data.test_fraction=0.4"]


def small_documents(folder: Path) -> Path:
    """40 short files (100-340 bytes), so stream units of 64 targets often span two documents."""
    folder.mkdir()
    for i in range(40):
        words = " ".join(f"w{(i * 7 + k) % 23}" for k in range(30 + (i * 37) % 80))
        (folder / f"doc{i:02d}.txt").write_text(words[: 100 + (i * 53) % 240])
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny run of each windows mode on the short files: windows -> its folder (kept as the run wrote it)."""
    base = tmp_path_factory.mktemp("documents")
    data = small_documents(base / "text")
    out = {}
    for windows in ("stream", "documents"):
        out[windows] = base / windows
        assert main(["run", *MICRO, "--data", str(data), "--set", f"eval.windows={windows}", "--out",
                     str(out[windows])]) == 0
    return out


def made_before(run_folder: Path, to: Path, keep_documents: bool = False) -> Path:
    """A copy of a run's results as if made before units named their documents (and, unless
    ``keep_documents``, before the run listed its documents)."""
    to.mkdir()
    data = json.loads((run_folder / "results.json").read_text())
    old = without_documents(data)
    if keep_documents:
        old["run"]["eval_documents"] = data["run"]["eval_documents"]
    (to / "results.json").write_text(json.dumps(old, indent=1) + "\n")
    return to


@pytest.mark.parametrize("windows", ["stream", "documents"])
def test_a_fresh_run_records_what_the_backfill_rebuilds(runs, windows, tmp_path):
    fresh = json.loads((runs[windows] / "results.json").read_text())
    docs = fresh["run"]["eval_documents"]
    for rec in text_records(fresh):
        assert len(rec["units"]["doc"]) == len(rec["units"]["nll"]) == 16  # 1024 targets in units of 64
    doc = fresh["records"][0]["units"]["doc"]
    assert doc == sorted(doc) and set(doc) <= set(range(len(docs)))  # in scoring order
    if windows == "documents":
        assert list(docs.values()) == [64 * doc.count(d) for d in range(len(docs))]  # a segment: one document
    else:  # the stream's targets in order: each unit's 64 goes to the document that holds most of them
        ends = [sum(list(docs.values())[: d + 1]) for d in range(len(docs))]
        held = [[max(0, min(end, 64 * u + 64) - max(end - n, 64 * u)) for end, n in zip(ends, docs.values())]
                for u in range(16)]
        assert doc == [h.index(max(h)) for h in held]
        assert sum(1 for h in held if sorted(h)[-2] > 0) > 4  # many units span two documents
    old = made_before(runs[windows], tmp_path / "old")
    done = backfill(old)
    assert done.outcome == "written" and done.records == 2 and done.documents == len(docs)
    assert "fingerprint checked" in done.line()
    after = json.loads((old / "results.json").read_text())
    assert after == fresh  # the same documents, and every other value as it was
    assert backfill(old).outcome == "already"  # a second pass leaves it alone


@pytest.mark.parametrize("windows", ["stream", "documents"])
def test_the_documents_follow_from_the_run_s_eval_documents_alone(runs, windows, tmp_path):
    fresh = json.loads((runs[windows] / "results.json").read_text())
    derived = from_run_metadata(fresh["run"])
    assert unit_documents(derived.target_docs, derived.unit) == fresh["records"][0]["units"]["doc"]
    old = made_before(runs[windows], tmp_path / "old", keep_documents=True)
    assert "no text to check" in backfill(old, from_metadata=True).line()
    assert json.loads((old / "results.json").read_text()) == fresh


@pytest.mark.parametrize("listed, hint", [(False, "rebuild it where the run was made$"),
                                          (True, "rebuild it where the run was made, or derive the documents from "
                                                 "the run's eval_documents with --from-metadata$")])
def test_another_text_is_refused_and_nothing_is_written(runs, tmp_path, listed, hint):
    old = made_before(runs["stream"], tmp_path / "old", keep_documents=listed)
    data = json.loads((old / "results.json").read_text())
    data["run"]["eval_fingerprint"] = "0123456789abcdef"  # scored on other tokens than these
    (old / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    before = (old / "results.json").read_bytes()
    with pytest.raises(DocumentsError, match=r"^rebuilt eval text differs from the records': eval fingerprint "
                                             r"[0-9a-f]{16} here, 0123456789abcdef in .* \(corpus '.*': fingerprint "
                                             r"[0-9a-f]{16} here, [0-9a-f]{16} there\); " + hint):
        backfill(old)
    assert (old / "results.json").read_bytes() == before


@pytest.mark.parametrize("change, message", [
    (lambda d: d["records"][0]["units"].update(size=32), "units of 32 targets in rope at 32"),
    (lambda d: d["run"].update(eval_documents={"elsewhere.txt": 1024}), "its documents are not the run's eval_documents"),
    (lambda d: d["records"][0]["units"].update(nll=d["records"][0]["units"]["nll"][:-1]), "16 units of 64 targets, 15"),
])
def test_records_that_do_not_fit_the_rebuilt_text_are_refused(runs, tmp_path, change, message):
    old = made_before(runs["stream"], tmp_path / "old")
    data = json.loads((old / "results.json").read_text())
    change(data)
    (old / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    before = (old / "results.json").read_bytes()
    with pytest.raises(DocumentsError, match="rebuilt eval text differs from the records'") as e:
        backfill(old)
    assert message in str(e.value) and (old / "results.json").read_bytes() == before


def test_a_task_folder_has_nothing_to_do_and_a_folder_with_documents_is_left_alone(runs, tmp_path):
    (tmp_path / "task").mkdir()
    shutil.copy(ROOT / "results" / "tasks" / "copy" / "results.json", tmp_path / "task" / "results.json")
    before = (tmp_path / "task" / "results.json").read_bytes()
    assert "nothing to do: task records" in backfill(tmp_path / "task").line()
    assert (tmp_path / "task" / "results.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "task").iterdir()) == ["results.json"]  # not even locked
    shutil.copytree(runs["stream"], tmp_path / "fresh")
    before = (tmp_path / "fresh" / "results.json").read_bytes()
    assert "left alone" in backfill(tmp_path / "fresh" / "results.json").line()  # a results file names its folder
    assert (tmp_path / "fresh" / "results.json").read_bytes() == before


def test_from_metadata_needs_the_documents_listed(runs, tmp_path):
    old = made_before(runs["stream"], tmp_path / "old")  # no eval_documents: made before runs listed them
    with pytest.raises(DocumentsError, match="--from-metadata needs the run's eval_documents"):
        backfill(old, from_metadata=True)
    with pytest.raises(DocumentsError, match="not its eval tokens"):
        from_run_metadata({"eval_documents": {"a": 10}, "eval_tokens": 1024, "segment_len": 64, "eval_lengths": [64]})


def test_records_without_per_unit_numbers_have_nothing_to_name(runs, tmp_path):
    old = made_before(runs["stream"], tmp_path / "old")
    data = json.loads((old / "results.json").read_text())
    for rec in data["records"]:
        del rec["units"]  # made before units existed
    (old / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    with pytest.raises(DocumentsError, match="has no record with per-unit numbers .made before units existed."):
        backfill(old)
