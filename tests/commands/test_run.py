"""`posenc-bench run` end to end on a micro config: results and their files, resume, n/a and diverged cells,
bad input and a first run without traps (every refusal before anything is printed or trained)."""

import json
import os
import subprocess
import sys

import pytest

from posenc_bench.commands.cli import main

from tests.commands.cli_helpers import MICRO, parsed, run

ROWS = "rope,rope-linear,learned,alibi,nope+sw16"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    assert main(["run", *MICRO, "--out", str(tmp / "out"), "--encodings", ROWS]) == 0
    return tmp / "out"


def test_results_schema_and_files(finished):
    data = json.loads((finished / "results.json").read_text())
    recs = data["records"]
    assert {(r["encoding"], r["eval_len"]) for r in recs} == {
        (e, L) for e in ("rope", "rope-linear", "learned", "alibi", "nope+sw16") for L in (32, 48, 64, 128)
    }
    windowed = [r for r in recs if r["encoding"] == "nope+sw16"]
    assert all(r["window"] == 16 and r["base_encoding"] == "nope" and r["status"] == "ok" for r in windowed)
    required = {"encoding", "seed", "train_len", "eval_len", "ratio", "ppl", "bpb", "loss", "tokens", "status",
                "reason", "train_time_s", "eval_time_s", "config", "corpus_fingerprint", "eval_fingerprint",
                "versions", "device", "git_commit", "loss_by_position"}
    ok = [r for r in recs if r["status"] == "ok"]
    assert all(required <= set(r) for r in ok)
    tokens = {r["tokens"] for r in ok}
    assert len(tokens) == 1  # the same target tokens at every length
    assert data["run"]["eval_lengths"] == [32, 48, 64, 128]
    assert (finished / "results.csv").read_text().startswith("encoding,seed,")
    table = (finished / "table.md").read_text()
    assert "| rope-linear |" in table.replace("  ", "") or "rope-linear" in table
    assert "1.5x (48)" in table
    assert list(finished.glob("**/*.tmp")) == []
    # rope-linear reused rope's checkpoint: identical numbers at the train length
    at1 = {r["encoding"]: r["ppl"] for r in ok if r["eval_len"] == 32}
    assert at1["rope"] == at1["rope-linear"]
    assert not (finished / "checkpoints" / "rope-linear-seed0").exists()


def test_learned_past_its_table_is_na_with_reason(finished):
    recs = json.loads((finished / "results.json").read_text())["records"]
    learned = {r["eval_len"]: r for r in recs if r["encoding"] == "learned"}
    assert learned[32]["status"] == "ok"
    for L in (48, 64, 128):
        assert learned[L]["status"] == "n/a" and "32 rows" in learned[L]["reason"] and learned[L]["ppl"] is None
    assert "n/a [1]" in (finished / "table.md").read_text()


def test_rerun_resumes_without_redoing_finished_cells(finished, capsys):
    before = (finished / "results.json").read_text()
    assert main(["run", *MICRO, "--out", str(finished), "--encodings", ROWS]) == 0
    out = capsys.readouterr().out
    assert out.count("done before, skipped") == 5
    after = json.loads((finished / "results.json").read_text())
    assert [r["ppl"] for r in after["records"]] == [r["ppl"] for r in json.loads(before)["records"]]


def test_interrupted_sweep_resumes_and_reuses_checkpoints(tmp_path, capsys, monkeypatch):
    import posenc_bench.bench.sweep as runner

    calls = []
    real = runner.Sweep.run_cell

    def flaky(self, row, seed):
        if row.name == "nope":
            raise KeyboardInterrupt
        calls.append(row)
        return real(self, row, seed)

    monkeypatch.setattr(runner.Sweep, "run_cell", flaky)
    assert run(tmp_path, "--encodings", "alibi,nope,t5") == 130  # interrupted at the second cell
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["encoding"] for r in data["records"]} == {"alibi"}
    monkeypatch.setattr(runner.Sweep, "run_cell", real)
    capsys.readouterr()
    assert run(tmp_path, "--encodings", "alibi,nope,t5") == 0
    out = capsys.readouterr().out
    assert "alibi seed 0: done before, skipped" in out
    assert "nope seed 0: trained" in out and "t5 seed 0: trained" in out


def test_same_config_twice_gives_the_same_numbers(tmp_path):
    assert run(tmp_path, "--encodings", "t5", out="a") == 0
    assert run(tmp_path, "--encodings", "t5", out="b") == 0
    a = json.loads((tmp_path / "a" / "results.json").read_text())["records"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["records"]
    assert [r["ppl"] for r in a] == [r["ppl"] for r in b]


def test_diverged_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    assert run(tmp_path, "--encodings", "rope,rope-linear,alibi", "--lr", "80", "--set", "train.grad_clip=1e9",
               "--set", "train.warmup_steps=1") == 0
    recs = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    statuses = {r["encoding"]: r["status"] for r in recs}
    assert statuses["rope"] == "diverged" and statuses["rope-linear"] == "diverged"
    div = [r for r in recs if r["status"] == "diverged"]
    assert all("diverged at step" in r["reason"] for r in div)
    assert "diverged" in (tmp_path / "out" / "table.md").read_text()
    assert all(r["divergence_rule"] == {"factor": 2.0, "patience": 3} for r in div)


def test_a_cell_called_diverged_by_another_rule_is_trained_again(tmp_path, capsys):
    """A diverged cell records the rule that called it so; a later run under the same rule reuses it, under
    another (a record or checkpoint from before divergence_patience, which has none) trains it again."""
    args = ("--encodings", "rope", "--lr", "80", "--set", "train.grad_clip=1e9", "--set", "train.warmup_steps=1")
    assert run(tmp_path, *args) == 0
    results, meta = tmp_path / "out" / "results.json", tmp_path / "out" / "checkpoints" / "rope-seed0" / "config.json"
    first = json.loads(results.read_text())["records"]
    assert {r["status"] for r in first} == {"diverged"} and json.loads(meta.read_text())["divergence_rule"]
    capsys.readouterr()
    assert run(tmp_path, *args) == 0
    assert json.loads(results.read_text())["records"] == first and "training it again" not in capsys.readouterr().out
    for path, key in ((results, "records"), (meta, None)):  # as written before the rule was recorded
        data = json.loads(path.read_text())
        for item in data[key] if key else [data]:
            item.pop("divergence_rule")
        path.write_text(json.dumps(data))
    assert run(tmp_path, *args) == 0
    out = capsys.readouterr().out
    assert ("rope seed 0: its checkpoint was called diverged by another rule (one step above the threshold); "
            "training it again") in out
    again = json.loads(results.read_text())["records"]
    assert len(again) == len(first) and all(r["divergence_rule"] == {"factor": 2.0, "patience": 3} for r in again)


@pytest.mark.parametrize("args,message", [
    (["--steps", "9"], "different 'train' config"),
    (["--precision", "bf16"], "different 'precision' config"),
    (["--eval-lens", "1,2x"], "evaluated at other lengths"),
])
def test_other_config_in_same_folder_is_refused(finished, capsys, args, message):
    assert main(["run", *MICRO, "--out", str(finished), "--encodings", "rope", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--encodings", "rope,rotary"], "unknown encoding 'rotary'; valid encodings: sinusoidal, learned"),
    (["--set", "model.width=3"], "unknown config key model.width; valid keys of model: d_model"),
    (["--d-model", "36", "--encodings", "rope"], "needs an even head dimension"),
    (["--n-heads", "5"], "n_heads=5 does not divide model.d_model=64"),
    (["--eval-lens", "0"], "must be at least 1"),
    (["--data", "/no/such/dir/*.txt"], "'/no/such/dir/*.txt' is not a readable file"),
    (["--device", "cuda"] , "CUDA is not available"),
    (["--seeds", "zero"], "--seeds 'zero'"),
    (["--seeds", "0"], "the count must be at least 1 (one seed by its number: --seeds 0,)"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys, args, message):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert run(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_fresh_starts_over_in_the_same_folder(tmp_path, capsys):
    assert run(tmp_path, "--encodings", "nope") == 0
    assert run(tmp_path, "--encodings", "nope", "--steps", "9") == 2
    (tmp_path / "out" / "README.md").write_text("notes on this run")  # a user's file in the folder
    assert run(tmp_path, "--encodings", "nope", "--steps", "9", "--fresh") == 0
    assert (tmp_path / "out" / "README.md").read_text() == "notes on this run"  # --fresh removes only run outputs
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["run"]["config"]["train"]["steps"] == 9
    assert {r["config"]["train"]["steps"] for r in data["records"]} == {9}


def test_seeds_give_mean_and_spread_and_the_saved_config_reproduces_the_run(tmp_path, capsys):
    from posenc_bench.bench.config import load_config

    assert run(tmp_path, "--encodings", "alibi", "--seeds", "2", "--progress", "auto") == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # no progress bars when stderr is not a terminal
    assert "posenc-bench run: 1 row(s) x 2 seed(s): 2 cell(s)" in captured.out and "| alibi" in captured.out
    assert "effective config:" not in captured.out  # the whole config only with --verbose (and in config.yaml)
    out = tmp_path / "out"
    recs = json.loads((out / "results.json").read_text())["records"]
    assert sorted({r["seed"] for r in recs}) == [0, 1]
    assert "±" in (out / "table.md").read_text()
    saved = load_config(str(out / "config.yaml"))
    assert saved.to_dict() == json.loads((out / "results.json").read_text())["run"]["config"]
    assert saved.seeds == [0, 1] and saved.train.steps == 8 and saved.encodings == ["alibi"]


def test_interrupted_training_continues_from_its_last_save(tmp_path, capsys, monkeypatch):
    from posenc_bench import data

    real_next, calls = data.TrainBatches.next, []

    def next_or_interrupt(self):
        calls.append(1)
        if len(calls) == 7:  # step 6 of 8; the run saved its state after step 4
            raise KeyboardInterrupt
        return real_next(self)

    monkeypatch.setattr(data.TrainBatches, "next", next_or_interrupt)
    assert run(tmp_path, "--encodings", "rope", "--set", "save_every=4", out="a") == 130
    assert (tmp_path / "a" / "checkpoints" / "rope-seed0" / "train_state.pt").is_file()
    monkeypatch.setattr(data.TrainBatches, "next", real_next)
    capsys.readouterr()
    assert run(tmp_path, "--encodings", "rope", "--set", "save_every=4", out="a") == 0
    assert "rope seed 0: resuming from step 4 of 8" in capsys.readouterr().out
    assert not (tmp_path / "a" / "checkpoints" / "rope-seed0" / "train_state.pt").exists()
    assert run(tmp_path, "--encodings", "rope", out="b") == 0  # uninterrupted, same config otherwise
    a = json.loads((tmp_path / "a" / "results.json").read_text())["records"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["records"]
    assert [r["ppl"] for r in a] == [r["ppl"] for r in b]
    assert a[0]["train_curve"] == b[0]["train_curve"]


@pytest.mark.parametrize("value,expected", [
    ("rope,alibi,-learned", ["rope", "alibi"]),
    ("-learned,-rope-linear", ["sinusoidal", "t5", "rope", "alibi", "nope"]),
    ("all,-nope,-rope-ft", ["sinusoidal", "learned", "rope", "rope-partial", "xpos", "xpos+bca", "fope", "rnope-swa",
                            "rope-linear", "rope-ntk", "rope-dynamic", "rope-yarn", "rope-llama3", "rope-linear-ft",
                            "rope-ntk-ft", "rope-dynamic-ft", "rope-yarn-ft", "rope-llama3-ft", "rope-rerope",
                            "rope-leaky", "rope-selfextend", "rope-string", "t5", "alibi", "kerple", "kerple-power",
                            "fire", "dape-kerple", "dape-alibi", "cope", "fox", "path", "stickbreaking",
                            "sinusoidal+rand", "learned+rand", "rope+rand", "rope-partial+rand", "xpos+rand",
                            "alibi+rand", "kerple+rand", "kerple-power+rand", "fire+rand", "sinusoidal+ssmax",
                            "learned+ssmax", "rope+ssmax", "rope-partial+ssmax", "xpos+ssmax", "nope+ssmax"]),
    ("xpos+bca,learned+rand+sw8", ["xpos+bca", "learned+rand+sw8"]),
    ("rope+sw16,alibi", ["rope+sw16", "alibi"]),
])
def test_encodings_flag(value, expected):
    from posenc_bench.commands.run import parse_encodings
    from posenc_bench.bench.config import RunConfig

    assert parse_encodings(value, RunConfig().encodings) == expected


def test_corrupt_results_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text('{"schema_version": 1, "run": {')
    assert run(tmp_path, "--encodings", "nope") == 2
    assert "truncated or corrupt" in capsys.readouterr().err
    assert (tmp_path / "out" / "results.json").read_text() == '{"schema_version": 1, "run": {'  # left as it was


def test_strided_protocol_is_recorded_and_captioned(tmp_path, capsys):
    assert run(tmp_path, "--encodings", "rope", "--protocol", "strided", "--stride", "8") == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {(r["eval_len"], r["protocol"], r["stride"]) for r in data["records"]} == {
        (32, "strided", 8), (48, "strided", 8), (64, "strided", 8), (128, "strided", 8)}
    assert "strided protocol: each window scores its last 8 targets" in (tmp_path / "out" / "table.md").read_text()
    assert run(tmp_path, "--encodings", "rope", "--stride", "8", out="bad") == 2
    assert "the strided protocol needs a stride >= 1 token" in capsys.readouterr().err


def test_records_carry_units_and_the_table_flags_models_on_the_plateau(finished):
    """Every measured record keeps its per-unit sums (units of the longest eval length, the same for every row
    and length), and an 8-step model that has not learned to use context is flagged in table.md."""
    data = json.loads((finished / "results.json").read_text())
    ok = [r for r in data["records"] if r["status"] == "ok"]
    S = data["run"]["segment_len"]
    for r in ok:
        u = r["units"]
        assert u["size"] == 128 and len(u["nll"]) == data["run"]["eval_tokens"] // S * -(-S // 128)
        assert sum(u["tokens"]) == r["tokens"] and sum(u["bytes"]) == r["bytes"]
        assert sum(u["nll"]) == pytest.approx(r["loss"] * r["tokens"], rel=1e-9)
    assert len({tuple(r["units"]["tokens"]) for r in ok}) == 1
    table = (finished / "table.md").read_text()
    assert "uses only local context" in table and "Intervals: 95%; one seed: the text resampled over" in table


def test_run_with_an_unknown_config_name_lists_the_built_in_ones(capsys):
    assert main(["run", "--config", "defualt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "built-in configs: ci, default, full, long-2048" in err


# ---- a first run without traps: every refusal comes before anything is printed or trained ----------------

@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_cannot_be_created_is_one_line_although_its_parent_looks_writable(capsys):
    """/proc passes an os.access check as root, yet no folder can be made in it: the check is the attempt."""
    assert main(["run", *MICRO, "--encodings", "nope", "--out", "/proc/posenc-out"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("posenc-bench run: error: output folder '/proc/posenc-out' cannot be written: creating it "
                          "failed (") and err.count("\n") == 1
    assert out == ""


def test_a_start_that_fails_leaves_no_folder_behind(tmp_path):
    from posenc_bench.bench.records import ResultsError, ResultsFolder

    with pytest.raises(ResultsError):
        with ResultsFolder(tmp_path / "new"):
            raise ResultsError("refused after the folder was made")
    assert not (tmp_path / "new").exists()  # it made the folder, so it takes it away again
    (tmp_path / "kept").mkdir()
    with pytest.raises(ResultsError):
        with ResultsFolder(tmp_path / "kept"):
            raise ResultsError("refused")
    assert (tmp_path / "kept").is_dir()  # a folder it did not make stays


@pytest.mark.parametrize("setup,message", [
    ("locked", "is being written by pid"),
    ("other train length", "different 'train' config"),
    ("truncated", "truncated or corrupt"),
])
def test_refusals_come_before_the_summary_and_any_training(tmp_path, capsys, setup, message):
    out = tmp_path / "out"
    assert run(tmp_path, "--encodings", "nope") == 0
    capsys.readouterr()
    extra = []
    if setup == "locked":
        from filelock import FileLock

        lock = FileLock(out / ".results.json.lock")
        lock.acquire()
        (out / ".results.json.owner").write_text("pid 4242 (started today)\n")
    elif setup == "other train length":
        extra = ["--train-len", "16"]
    else:
        (out / "results.json").write_text('{"schema_version": 1, "run": {')
    try:
        assert run(tmp_path, "--encodings", "nope", *extra) == 2
    finally:
        if setup == "locked":
            lock.release()
    printed, err = capsys.readouterr()
    assert message in err and err.count("\n") == 1
    assert printed == ""  # no summary, no config, no training line


def test_the_summary_is_a_few_lines_and_verbose_adds_the_whole_config(tmp_path, capsys):
    assert run(tmp_path, "--encodings", "nope,alibi", "--seeds", "2") == 0
    out = capsys.readouterr().out
    head = out[:out.index("  nope seed 0")].strip().splitlines()
    assert head[0].startswith("posenc-bench run: 2 row(s) x 2 seed(s): 4 cell(s); train length 32, eval lengths "
                              "32, 48, 64, 128 (1,152 target tokens each)")
    assert "corpus stdlib (" in head[1] and "config.yaml" in head[1] and "work: 4 trained model(s)" in head[2]
    assert len(head) <= 5 and "effective config" not in out
    assert run(tmp_path, "--encodings", "nope,alibi", "--seeds", "2", "--verbose", out="v") == 0
    verbose = capsys.readouterr().out
    assert "effective config:\nencodings:\n- nope\n- alibi" in verbose and "done before" not in verbose


def test_eval_lengths_without_an_x_below_the_train_length_are_a_question(tmp_path, capsys):
    assert run(tmp_path, "--eval-lens", "1,2,4") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval length 1 reads as 1 token, below the train length 32: did you mean " \
                                    "multiples of it (1,2,4x)?" in err
    assert not (tmp_path / "out").exists()


def test_run_without_a_config_is_the_default_config():
    from posenc_bench.bench.config import load_config
    from posenc_bench.commands.run import run_config
    from tests.commands.cli_helpers import parsed

    cfg = run_config(parsed("run"))
    default = load_config("default")
    assert {**cfg.to_dict(), "out": default.out} == default.to_dict()
    assert default.out == "results/default" and cfg.out == "runs/default"  # the committed folder is never the default
    assert run_config(parsed("run", "--config", "default")).to_dict() == cfg.to_dict()
    assert run_config(parsed("run", "--steps", "3")).train.steps == 3
    assert cfg.train.compile is False and run_config(parsed("run", "--compile")).train.compile is True


@pytest.mark.parametrize("args, out", [
    ([], "runs/default"), (["--config", "tasks-copy"], "runs/tasks/copy"), (["--config", "ci"], "runs/ci"),
    (["--out", "results/default"], "results/default"),  # named explicitly: written there
    (["--set", "out=results/sotu-512"], "results/sotu-512"), (["--out", "mine"], "mine"),
])
def test_a_run_writes_under_runs_unless_out_names_a_folder(args, out):
    from posenc_bench.commands.run import run_config
    from tests.commands.cli_helpers import parsed

    assert run_config(parsed("run", *args)).out == out


def test_fresh_never_deletes_a_committed_folder_without_the_second_flag(tmp_path, capsys):
    """A folder git tracks is committed results: --fresh alone is refused in one line that names another folder
    and no destructive flag; --fresh --delete-committed (the docs' second, explicit flag) deletes it."""
    import subprocess

    folder = tmp_path / "results" / "r"
    assert main(["run", *MICRO, "--encodings", "rope", "--out", str(folder)]) == 0
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "results/r/results.json"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "results"], cwd=tmp_path, check=True)
    before = (folder / "results.json").read_bytes()
    capsys.readouterr()
    assert main(["run", *MICRO, "--encodings", "rope", "--out", str(folder), "--fresh"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a committed results folder" in err and "--out" in err
    assert "--delete-committed" not in err and "--fresh" in err
    assert (folder / "results.json").read_bytes() == before
    assert main(["run", *MICRO, "--encodings", "rope", "--out", str(folder), "--fresh", "--delete-committed"]) == 0


def test_sigterm_stops_a_run_like_ctrl_c_and_releases_its_folder(tmp_path):
    """A CI timeout sends SIGTERM: the lock and its owner file go, the user is told how to resume (exit 143)."""
    import os
    import signal
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "posenc_bench", "run", *MICRO, "--encodings", "t5,rope,alibi",
                             "--steps", "3000", "--out", str(out)], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    deadline = time.time() + 120
    while not (out / "checkpoints").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # training has started once the first checkpoint folder exists
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "posenc-bench run: terminated (SIGTERM); rerun the same command to resume"
    assert not (out / ".results.json.owner").exists()
    from filelock import FileLock

    with FileLock(out / ".results.json.lock").acquire(timeout=0):  # free for the next run
        pass


@pytest.mark.parametrize("value,expected", [("3", [0, 1, 2]), ("1", [0]), ("1,", [1]), ("0,5,7", [0, 5, 7])])
def test_seeds_flag_is_a_count_or_a_list(value, expected):
    from posenc_bench.commands.run import parse_seeds

    assert parse_seeds(value) == expected


def test_run_reads_its_config_file_once(monkeypatch):
    """The file's encodings (the base of --encodings -learned) and the flags come from one read of the file."""
    from posenc_bench.bench.config import load
    from posenc_bench.commands.run import run_config
    from tests.commands.cli_helpers import parsed

    reads = []
    real = load.resolve_config
    monkeypatch.setattr(load, "resolve_config", lambda spec: reads.append(spec) or real(spec))
    cfg = run_config(parsed("run", "--config", "ci", "--encodings=-learned", "--steps", "3"))
    assert reads == ["ci"] and "learned" not in cfg.encodings and cfg.train.steps == 3


@pytest.mark.parametrize("argv", [
    ["--train-len", "2048", "--eval-lens", "4096", "--out", "/tmp/mission"],
    [],
    ["--config", "ci", "--seeds", "0,5", "--lr", "0.001", "--set", "train.warmup_steps=5", "--set", "seed=2", "--fresh",
     "--device", "cpu", "--progress", "off"],
    ["--compile", "--steps", "3"],
])
def test_given_argv_is_the_command_line_again(argv):
    """The run's cheaper plans repeat its own flags: the flags given, in the parser's order, parse back to the
    same arguments."""
    from posenc_bench.commands.run import given_argv

    args = parsed("run", *argv)
    again = given_argv(args)
    assert sorted(again) == sorted(argv)
    assert vars(parsed("run", *again)) == vars(args)
