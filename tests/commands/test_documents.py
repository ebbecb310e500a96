"""`posenc-bench documents`: a line per folder on what it did, and a text that differs as one line and exit 2 (the
rules themselves are tested in tests/bench/eval/test_documents.py)."""

import json
import shutil
from pathlib import Path

import pytest

from posenc_bench.bench.eval.documents import without_documents
from posenc_bench.commands.cli import main

from tests.commands.test_bad_input import one_line

ROOT = Path(__file__).resolve().parents[2]


def made_before(folder: str, to: Path, **run) -> Path:
    """A copy of a committed folder's results as they were before units named their documents (``run``: run
    metadata to change)."""
    to.mkdir(parents=True)
    data = without_documents(json.loads((ROOT / folder / "results.json").read_text()))
    data["run"].update(run)
    (to / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    return to


def test_each_folder_gets_its_documents_and_a_line(tmp_path, capsys):
    """results/sotu-512 (documents windows, 11 speeches) as it was before: rebuilt and checked, its documents
    exactly the committed ones; a task folder: nothing to do."""
    old = made_before("results/sotu-512", tmp_path / "sotu-512")
    task = tmp_path / "task"
    task.mkdir()
    shutil.copy(ROOT / "results" / "tasks" / "copy" / "results.json", task / "results.json")
    assert main(["documents", str(old), str(task)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{old}/results.json: wrote the documents of the units of 187 text record(s) (11 document(s); "
                     "rebuilt from the run's config (documents windows), fingerprint checked)",
                     f"{task}/results.json: nothing to do: task records (each unit is one test instance, not a block "
                     "of text)"]
    assert json.loads((old / "results.json").read_text()) == json.loads((ROOT / "results/sotu-512/results.json").read_text())


@pytest.mark.parametrize("folder, argv, run, message", [
    ("results/sotu-512", [], {"eval_fingerprint": "0123456789abcdef"},
     "posenc-bench documents: error: rebuilt eval text differs from the records': eval fingerprint a6899c20994bf7a4 "
     "here, 0123456789abcdef in {old} (corpus 'sotu': fingerprint fc45a1784a427955 here, fc45a1784a427955 there); "
     "rebuild it where the run was made"),
    ("results/sotu-512", ["--from-metadata"], {},
     "posenc-bench documents: error: --from-metadata needs the run's eval_documents (name -> targets of each "
     "document); this run records None: rebuild its text instead (without --from-metadata)"),
    ("results/smollm2", ["--model", "results/default"], {},
     "posenc-bench documents: error: --model 'results/default': expected hf:<local folder | hub name | file.gguf>"),
])
def test_a_folder_that_cannot_get_its_documents_is_one_line_and_exit_2(folder, argv, run, message, tmp_path, capsys):
    old = made_before(folder, tmp_path / "old", **run)
    before = (old / "results.json").read_bytes()
    assert main(["documents", str(old), *argv]) == 2
    assert one_line(capsys).startswith(message.replace("{old}", str(old)))
    assert (old / "results.json").read_bytes() == before
