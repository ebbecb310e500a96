"""The results folder and the checkpoints as a user meets them: one writer at a time, nothing lost, damaged
checkpoints retrained or refused, keys that hold only what a cell depends on."""

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from posenc_bench.commands.cli import main

MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "32", "--steps", "8", "--eval-tokens", "1024",
         "--progress", "off"]
ROOT = Path(__file__).resolve().parents[2]


def run(out, *extra):
    return main(["run", *MICRO, "--out", str(out), *extra])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "out"
    assert run(out, "--encodings", "rope,t5") == 0
    return out


@contextlib.contextmanager
def folder_held_by_another_process(out):
    """A separate process holding ``out``'s results lock, as a running `run` does; yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom posenc_bench.bench.records import ResultsFolder\n"
         f"with ResultsFolder({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_second_writer_of_the_same_folder_stops_with_one_line_naming_the_first(tmp_path, capsys):
    """Two `run`s with the same --out: the second stops (exit 2) while the first holds the folder, so the
    first one's results are never overwritten."""
    out = tmp_path / "out"
    assert run(out, "--encodings", "nope") == 0
    with folder_held_by_another_process(out) as pid:
        capsys.readouterr()
        assert run(out, "--encodings", "alibi") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"is being written by pid {pid}" in err and "another --out" in err
        assert main(["merge", str(out), "--out", str(out)]) == 2  # merge into it waits its turn too
        assert f"is being written by pid {pid}" in capsys.readouterr().err
    data = json.loads((out / "results.json").read_text())
    assert {r["encoding"] for r in data["records"]} == {"nope"}  # the first run's results are all there
    assert run(out, "--encodings", "alibi") == 0  # free again: the second run adds its rows to the first's
    data = json.loads((out / "results.json").read_text())
    assert {r["encoding"] for r in data["records"]} == {"nope", "alibi"}
    assert not list(out.glob(".results.json.owner"))


def test_an_unwritable_out_is_one_line_before_any_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert run(blocker / "out", "--encodings", "nope") == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "cannot be written" in err and str(blocker / "out") in err
    assert "posenc-bench run:" not in out  # checked before the summary and before any training


def test_changing_t5_options_retrains_only_t5(trained, capsys):
    assert run(trained, "--encodings", "rope,t5", "--set", "model.encoding_options={t5: {num_buckets: 16}}") == 0
    log = capsys.readouterr().out
    assert "rope seed 0: done before, skipped" in log
    assert "t5 seed 0: trained 8 steps" in log


def test_a_truncated_checkpoint_is_retrained_by_run_and_refused_by_eval_and_passkey(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(out, "--encodings", "rope") == 0
    weights = out / "checkpoints" / "rope-seed0" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut short
    capsys.readouterr()
    for argv in (["eval", "--model", str(weights.parent), "--out", str(tmp_path / "ev"), "--progress", "off"],
                 ["passkey", "--model", str(weights.parent), "--lengths", "32", "--trials", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "does not match the hash recorded" in err, err
    (out / "results.json").unlink()  # the cell must run again, and so meet its checkpoint
    assert run(out, "--encodings", "rope") == 0
    log = capsys.readouterr().out
    assert "rope seed 0: warning: checkpoint" in log and "training it again" in log
    assert "rope seed 0: trained 8 steps" in log
    assert main(["eval", "--model", str(weights.parent), "--out", str(tmp_path / "ev2"), "--progress", "off"]) == 0


def test_eval_of_another_checkpoint_into_a_folder_is_refused(trained, tmp_path, capsys):
    ev = tmp_path / "ev"
    assert main(["eval", "--model", str(trained / "checkpoints" / "rope-seed0"), "--out", str(ev),
                 "--progress", "off"]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(trained / "checkpoints" / "t5-seed0"), "--out", str(ev),
                 "--progress", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.encoding: 'rope' there, 't5' now" in err
    rows = {r["encoding"] for r in json.loads((ev / "results.json").read_text())["records"]}
    assert rows == {"rope"}


def test_the_run_records_the_parameter_count_of_each_rows_model(trained):
    params = json.loads((trained / "results.json").read_text())["run"]["params"]
    assert params["t5"] > params["rope"] > 0  # T5 adds its bucket table; the caption states the range
    md = (trained / "table.md").read_text()
    assert f"{params['rope']:,}-{params['t5']:,} parameters" in md


def test_bad_data_is_reported_before_the_config_dump(tmp_path, capsys):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "a.txt").write_text("x" * 10)
    assert run(tmp_path / "out", "--data", str(tmp_path / "tiny")) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "effective config" not in out


def test_a_row_is_on_disk_before_its_summary_line_is_printed(tmp_path, monkeypatch):
    """Stopping a sweep right after a row's line appears in the log loses nothing: the line is printed only
    once the row's records are in results.json."""
    from posenc_bench.bench import sweep

    out, seen = tmp_path / "out", []

    def summary(row, records):
        saved = json.loads((out / "results.json").read_text())["records"]
        seen.append((row, sum(r["encoding"] == records[0]["encoding"] for r in saved)))
        return f"  {row}"

    monkeypatch.setattr(sweep, "summary_line", summary)
    assert run(out, "--encodings", "nope,alibi") == 0
    assert seen == [("nope seed 0", 4), ("alibi seed 0", 4)]  # each row's 4 lengths already saved


# a micro run of the -ft rows (tests/bench/config/test_finetune.py: their plan)
FT_MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "16", "--steps", "20", "--eval-tokens", "512",
            "--eval-lens", "1,2,4x", "--progress", "off"]


def test_fine_tuned_rows_continue_the_rope_checkpoint_and_are_cached(tmp_path, capsys):
    out = tmp_path / "out"
    rows = "rope,rope-ft,rope-linear-ft,rope-linear"
    assert main(["run", *FT_MICRO, "--encodings", rows, "--out", str(out)]) == 0
    log = capsys.readouterr().out
    assert log.count("rope seed 0: trained 20 steps") == 1  # one pre-training for every rope row
    assert "rope-ft seed 0: fine-tuned 2 steps x 4 x 64 tokens" in log
    assert "rope-linear-ft seed 0: fine-tuned 2 steps x 4 x 64 tokens" in log
    data = json.loads((out / "results.json").read_text())
    recs = {(r["encoding"], r["eval_len"]): r for r in data["records"]}
    rope_key = recs["rope", 16]["cell_key"]
    ft = recs["rope-linear-ft", 16]["finetune"]
    assert ft["from_cell_key"] == rope_key and ft["len"] == 64 and ft["tokens"] == 2 * 4 * 64
    assert recs["rope-ft", 16]["cell_key"] not in (rope_key, recs["rope-linear-ft", 16]["cell_key"])
    # fine-tuning changed the weights, and the scaled row applies s = 4 even at 1x
    assert recs["rope-ft", 16]["ppl"] != recs["rope", 16]["ppl"]
    assert recs["rope-linear-ft", 16]["ppl"] != recs["rope-ft", 16]["ppl"]
    meta = json.loads((out / "checkpoints" / "rope-linear-ft-seed0" / "config.json").read_text())
    assert meta["finetune"]["status"] == "ok" and meta["encoding"] == "rope-linear-ft"

    assert main(["run", *FT_MICRO, "--encodings", rows, "--out", str(out)]) == 0  # finished: nothing redone
    assert "rope-linear-ft seed 0: done before, skipped" in capsys.readouterr().out
    assert main(["run", *FT_MICRO, "--encodings", rows, "--out", str(out), "--finetune-steps", "3"]) == 0
    log = capsys.readouterr().out
    assert "rope seed 0: reusing checkpoint" in log and "rope-linear-ft seed 0: fine-tuned 3 steps" in log
    again = {(r["encoding"], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    assert again["rope", 16]["ppl"] == recs["rope", 16]["ppl"]  # untouched rows keep their numbers


def test_a_resumed_sweep_counts_the_cells_finished_before_and_says_1_thread(tmp_path, capsys, monkeypatch):
    """The second run of a folder with 2 of 4 cells done says "cell 3/4" after its first new cell (it said
    "cell 1/2"), and its summary says "1 thread" (the recorded device string keeps "1 threads")."""
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    tiny = ["--config", "ci", "--train-len", "16", "--steps", "5", "--eval-tokens", "256", "--seeds", "1",
            "--progress", "off", "--out", str(tmp_path / "out")]
    assert main(["run", *tiny, "--encodings", "rope,alibi"]) == 0
    capsys.readouterr()
    assert main(["run", *tiny, "--encodings", "rope,alibi,nope,t5"]) == 0
    out = capsys.readouterr().out
    assert "  cell 3/4, about " in out and "cell 1/" not in out, out
    assert "; 1 thread); out " in out  # the summary line
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["run"]["device"].endswith("; 1 threads)")  # the record: as committed results say it


def test_the_records_count_a_padded_models_real_parameters_only():
    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.sweep import row_params

    cfg = RunConfig()
    plain = row_params(cfg, ["rope", "learned"])
    cfg.model.vocab_multiple = 64
    assert row_params(cfg, ["rope", "learned"]) == plain


def test_key_tokens_are_the_evaluators_for_every_row_and_kept_in_the_folder(tmp_path, capsys):
    """eval.key_tokens.evaluator=rope: the rope model's key tokens, found before any row is scored, give every row
    the same key tokens per unit past 1x (none at 1x), in key_tokens.pt; turning them on in a folder made without
    re-evaluates its rows on their checkpoints; a rerun adding a row reuses the key tokens (the keys:
    tests/bench/test_keys.py; the file's hash: tests/bench/eval/test_key_tokens.py)."""
    from posenc_bench.bench.eval.key_tokens import KEY_TOKENS_FILE

    out = tmp_path / "keys"
    assert run(out, "--encodings", "nope", "--eval-lens", "1,2x") == 0  # a folder made without key tokens
    plain = json.loads((out / "results.json").read_text())["records"]
    keys = ["--set", "eval.key_tokens.evaluator=rope", "--set", "eval.key_tokens.alpha=0",  # an 8-step model's NLL
            "--set", "eval.key_tokens.beta=-8"]  # moves little with context, and stays above 2 nats
    capsys.readouterr()
    assert run(out, "--encodings", "nope,rope", "--eval-lens", "1,2x", *keys) == 0  # the same folder: accepted
    log = capsys.readouterr().out
    assert "key tokens: the evaluator rope seed 0 scores the eval text" in log
    assert "nope seed 0: reusing checkpoint" in log  # re-evaluated under its new eval key, not retrained
    data = json.loads((out / "results.json").read_text())
    at = {(r["encoding"], r["eval_len"]): r for r in data["records"]}
    assert (at["nope", 64]["ppl"], at["nope", 64]["cell_key"]) == (plain[1]["ppl"], plain[1]["cell_key"])
    assert at["nope", 64]["eval_key"] != plain[1]["eval_key"] and "key_nll" not in plain[1]["units"]
    assert all(r["key_evaluator"] == "rope" for r in data["records"])
    assert "key_tokens" not in at["nope", 32]["units"] and "key_tokens" not in at["rope", 32]["units"]
    counts = at["rope", 64]["units"]["key_tokens"]
    assert counts == at["nope", 64]["units"]["key_tokens"] and sum(counts) > 0
    assert at["rope", 64]["units"]["key_nll"] != at["nope", 64]["units"]["key_nll"]  # each row's own NLL
    assert (out / KEY_TOKENS_FILE).exists()

    assert run(out, "--encodings", "nope,rope,alibi", "--eval-lens", "1,2x", *keys) == 0
    assert "key tokens: the evaluator" not in capsys.readouterr().out  # the folder's key tokens, reused
    again = {(r["encoding"], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    assert again["alibi", 64]["units"]["key_tokens"] == counts

    # a later sweep of the same table (seed 1 only) names the same evaluator, rope seed 0, and takes its key tokens
    # from the first sweep's folder: the evaluator is not trained again, and the targets are the same
    later = tmp_path / "seed-1"
    later.mkdir()
    shutil.copy(out / KEY_TOKENS_FILE, later / KEY_TOKENS_FILE)
    assert run(later, "--encodings", "nope", "--seeds", "1,", "--eval-lens", "1,2x", *keys,
               "--set", "eval.key_tokens.seed=0") == 0
    log = capsys.readouterr().out
    assert "key tokens: the evaluator" not in log and "rope seed 0" not in log
    seed1 = {(r["encoding"], r["eval_len"]): r for r in json.loads((later / "results.json").read_text())["records"]}
    assert seed1["nope", 64]["seed"] == 1 and seed1["nope", 64]["units"]["key_tokens"] == counts
    assert seed1["nope", 64]["eval_key"] == again["nope", 64]["eval_key"]  # one key-token rule and evaluator model


def test_key_tokens_refuse_a_bad_evaluator_or_seed(tmp_path, capsys):
    assert run(tmp_path / "a", "--set", "eval.key_tokens.evaluator=ropee") == 2
    assert "ropee" in capsys.readouterr().err
    assert run(tmp_path / "b", "--set", "eval.key_tokens.evaluator=rope", "--set", "eval.key_tokens.seed=-1") == 2
    assert "eval.key_tokens.seed -1: a seed is 0 or more" in capsys.readouterr().err
    assert run(tmp_path / "c", "--set", "eval.key_tokens.evaluator=rope",
               "--set", "eval.key_tokens.short_context=short") == 2
    assert "valid: train, longppl" in capsys.readouterr().err
