"""`run --shard i/n` and `merge`: a sweep split three ways and merged equals the unsharded sweep."""

import json
from pathlib import Path

import pytest

from posenc_bench.commands.cli import main
from posenc_bench.bench.config import load_config
from posenc_bench.bench.run.shard import parse_shard, shard_cells, training_unit

TINY = ["--config", "configs/ci.yaml", "--train-len", "16", "--steps", "4", "--batch-size", "8", "--d-model", "32",
        "--n-layers", "1", "--eval-tokens", "256", "--eval-lens", "1x,2x", "--progress", "off",
        "--encodings", "rope,rope-linear,alibi", "--seeds", "2"]
# wall-clock fields and the output folder are the only things allowed to differ between the two runs
TIMES = {"train_time_s", "train_tokens_per_s", "eval_time_s"}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shards")
    data = small_corpus(tmp / "corpus")
    for i in (1, 2, 3):
        assert main(["run", *TINY, *data, "--shard", f"{i}/3", "--out", str(tmp / "shared")]) == 0
    assert main(["run", *TINY, *data, "--out", str(tmp / "single")]) == 0
    return tmp


def first_difference(a, b, where=""):
    """The dotted path of the first field where two nested dicts differ (None if equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            d = first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
            if d is not None:
                return d
        return None
    return None if a == b else (where, a, b)


def small_corpus(folder):
    """This package's own source files as a corpus: loads in milliseconds, unlike the stdlib."""
    folder.mkdir()
    for f in sorted(Path(__file__).resolve().parents[3].joinpath("posenc_bench").rglob("*.py")):
        (folder / f.name).write_bytes(f.read_bytes())
    return ["--data", str(folder), "--set", "data.test_fraction=0.3", "--set", "data.valid_fraction=0"]


def _comparable(data):
    recs = [{k: v for k, v in r.items() if k not in TIMES} for r in data["records"]]
    for r in recs:
        r["config"] = {k: v for k, v in r["config"].items() if k != "out"}
    return recs


def test_three_shards_merged_equal_the_unsharded_run(sweeps, capsys):
    shared = sweeps / "shared"
    assert sorted(p.name for p in shared.glob("results*")) == [f"results.shard-{i}-of-3.json" for i in (1, 2, 3)]
    # 4 training units (rope/rope-linear share one) dealt to 3 shards: 2, 1, 1 units
    per_shard = [json.loads((shared / f"results.shard-{i}-of-3.json").read_text()) for i in (1, 2, 3)]
    cells = [{(r["encoding"], r["seed"]) for r in d["records"]} for d in per_shard]
    assert sum(map(len, cells)) == len(set().union(*cells)) == 6  # disjoint, all six cells
    assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == [
        "alibi-seed0", "alibi-seed1", "rope-seed0", "rope-seed1"]

    assert main(["merge", str(shared), "--out", str(sweeps / "merged")]) == 0
    assert "merged 6 cell(s) from 3 file(s)" in capsys.readouterr().out
    merged = json.loads((sweeps / "merged" / "results.json").read_text())
    single = json.loads((sweeps / "single" / "results.json").read_text())
    assert _comparable(merged) == _comparable(single)  # same cells, same order, same numbers (bit for bit)
    for key in ("rows", "eval_lengths", "eval_fingerprint", "corpus", "params", "segment_len", "eval_tokens"):
        assert merged["run"][key] == single["run"][key], key
    assert first_difference(merged["run"]["config"], single["run"]["config"])[0] == "out"
    assert [m["shard"] for m in merged["run"]["merged_from"]] == ["1/3", "2/3", "3/3"]
    single_table = (sweeps / "single" / "table.md").read_text()
    assert (sweeps / "merged" / "table.md").read_text() == single_table
    assert (sweeps / "merged" / "results.csv").read_text().splitlines()[0] == \
        (sweeps / "single" / "results.csv").read_text().splitlines()[0]
    assert load_config(str(sweeps / "merged" / "config.yaml")).cells() == load_config(
        str(sweeps / "single" / "config.yaml")).cells()


def test_a_rerun_shard_skips_its_finished_cells(sweeps, capsys):
    data = ["--data", str(sweeps / "corpus"), "--set", "data.test_fraction=0.3", "--set", "data.valid_fraction=0"]
    assert main(["run", *TINY, *data, "--shard", "1/3", "--out", str(sweeps / "shared")]) == 0
    out = capsys.readouterr().out
    assert out.count("done before, skipped") == 3 and "steps in" not in out


def test_merge_lists_missing_cells_and_writes_only_with_partial(sweeps, tmp_path, capsys):
    part = tmp_path / "part"
    part.mkdir()
    for i in (1, 3):
        (part / f"results.shard-{i}-of-3.json").write_bytes((sweeps / "shared" / f"results.shard-{i}-of-3.json").read_bytes())
    missing = sorted(training_unit(*c)[0].name + f" seed {c[1]}" for c in shard_cells(
        load_config(str(sweeps / "single" / "config.yaml")).cells(), 2, 3))
    assert main(["merge", str(part), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no results.shard-2-of-3.json" in err and "--partial" in err
    assert all(m in err for m in missing)
    assert not (tmp_path / "m").exists()
    assert main(["merge", str(part), "--out", str(tmp_path / "m"), "--partial"]) == 0
    assert "missing" in capsys.readouterr().err
    assert len(json.loads((tmp_path / "m" / "results.json").read_text())["records"]) == 2 * (6 - len(missing))


@pytest.mark.parametrize("path, value, field", [
    (("train", "lr"), 0.01, "train.lr"),
    (("model", "d_model"), 64, "model.d_model"),
    (("eval", "tokens"), 512, "eval.tokens"),
])
def test_merge_refuses_shards_of_another_config_naming_the_field(sweeps, tmp_path, capsys, path, value, field):
    for i in (1, 2, 3):
        data = json.loads((sweeps / "shared" / f"results.shard-{i}-of-3.json").read_text())
        if i == 3:
            data["run"]["config"][path[0]][path[1]] = value
        (tmp_path / f"results.shard-{i}-of-3.json").write_text(json.dumps(data))
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "different config" in err and f"{field} is {value!r}" in err
    assert "results.shard-3-of-3.json" in err


def test_merge_refuses_shards_of_different_splits(sweeps, tmp_path, capsys):
    src = sweeps / "shared" / "results.shard-1-of-3.json"
    (tmp_path / "results.shard-1-of-3.json").write_bytes(src.read_bytes())
    data = json.loads(src.read_text())
    data["run"]["shard"]["count"] = 4
    (tmp_path / "results.shard-2-of-4.json").write_text(json.dumps(data))
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "n=3 and n=4" in capsys.readouterr().err


def test_a_later_sweep_of_more_seeds_for_some_rows_merges_with_the_first(sweeps, tmp_path, capsys):
    data = ["--data", str(sweeps / "corpus"), "--set", "data.test_fraction=0.3", "--set", "data.valid_fraction=0"]
    more = tmp_path / "more"
    for i in (1, 2):  # rope (and its rope-linear) at seeds 2 and 3, split its own way
        assert main(["run", *TINY, *data, "--encodings", "rope,rope-linear", "--seeds", "2,3", "--shard", f"{i}/2",
                     "--out", str(more)]) == 0
    capsys.readouterr()
    assert main(["merge", str(sweeps / "shared"), str(more), "--out", str(tmp_path / "m")]) == 0
    assert "merged 10 cell(s) from 5 file(s)" in capsys.readouterr().out
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    cells = list(dict.fromkeys((r["encoding"], r["seed"]) for r in merged["records"]))
    assert cells == [("rope", s) for s in range(4)] + [("rope-linear", s) for s in range(4)] + [("alibi", 0), ("alibi", 1)]
    assert merged["run"]["config"]["seeds"] == [0, 1, 2, 3] and merged["run"]["rows"] == ["rope", "rope-linear", "alibi"]
    single = {(r["encoding"], r["seed"], r["eval_len"]): r["ppl"]
              for r in json.loads((sweeps / "single" / "results.json").read_text())["records"]}
    assert all(single[(r["encoding"], r["seed"], r["eval_len"])] == r["ppl"] for r in merged["records"] if r["seed"] < 2)
    table = (tmp_path / "m" / "table.md").read_text()
    assert "Seeds per row (each row's interval rests on its own): rope, rope-linear: 4 seeds (0,1,2,3); alibi: 2 seeds (0,1)" in table
    assert "t over each row's training seeds' values (2-4 seeds; a comparison pairs the seeds both rows have)" in table
    (more / "results.shard-2-of-2.json").unlink()  # a sweep with a shard file absent: named with its folder
    assert main(["merge", str(sweeps / "shared"), str(more), "--out", str(tmp_path / "m2")]) == 2
    assert f"(no {more}/results.shard-2-of-2.json)" in capsys.readouterr().err


def test_one_seed_at_a_time_into_the_same_shard_folder_merges_as_one_sweep(sweeps, tmp_path, capsys):
    """The robustness cells' shape: `--seeds 0,` as two shards, then `--seeds 1,` into the same folder; the shard
    files hold both seeds, the folder's config every seed, and the merge equals the single run."""
    data = ["--data", str(sweeps / "corpus"), "--set", "data.test_fraction=0.3", "--set", "data.valid_fraction=0"]
    folder = tmp_path / "cells"
    for seed in (0, 1):
        for i in (1, 2):
            assert main(["run", *TINY, *data, "--seeds", f"{seed},", "--shard", f"{i}/2", "--out", str(folder)]) == 0
    capsys.readouterr()
    assert "seeds:\n- 0\n- 1\n" in (folder / "config.yaml").read_text()
    assert main(["merge", str(folder), "--out", str(tmp_path / "m")]) == 0
    assert "merged 6 cell(s) from 2 file(s)" in capsys.readouterr().out
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    single = {(r["encoding"], r["seed"], r["eval_len"]): r["ppl"]
              for r in json.loads((sweeps / "single" / "results.json").read_text())["records"]}
    got = {(r["encoding"], r["seed"], r["eval_len"]): r["ppl"] for r in merged["records"]}
    assert got == single and merged["run"]["config"]["seeds"] == [0, 1]


def test_merge_notes_inputs_from_different_commits(sweeps, tmp_path, capsys):
    for i in (1, 2, 3):
        data = json.loads((sweeps / "shared" / f"results.shard-{i}-of-3.json").read_text())
        data["run"]["git_commit"] = f"commit{i % 2}"
        (tmp_path / f"results.shard-{i}-of-3.json").write_text(json.dumps(data))
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 0
    assert "2 different git_commits: commit0, commit1" in capsys.readouterr().err


def test_merge_into_the_shard_folder_and_again(sweeps, capsys):
    shared = sweeps / "shared"
    assert main(["merge", str(shared), "--out", str(shared)]) == 0
    assert main(["merge", str(shared), "--out", str(shared)]) == 0  # reads the shard files, not its own output
    assert "from 3 file(s)" in capsys.readouterr().out


# ---- assignment --------------------------------------------------------------------------------------

def test_assignment_partitions_keeps_variants_with_their_base_and_balances():
    cfg = load_config("configs/ci.yaml", {"seeds": [0, 1, 2], "encodings": ["rope", "rope-linear", "alibi", "t5",
                                                                            "nope+sw16", "rope+sw16"]})
    cells = cfg.cells()
    for n in (1, 2, 3, 5, 16, 40):
        parts = [shard_cells(cells, i, n) for i in range(1, n + 1)]
        assert sorted((r.name, s) for p in parts for r, s in p) == sorted((r.name, s) for r, s in cells)
        # rope-linear is evaluated on rope's model: same shard, so no model is trained by two shards
        units = [len({training_unit(*c) for c in p}) for p in parts]
        assert sum(units) == len({training_unit(*c) for c in cells}) == 5 * 3  # 6 rows, rope-linear shares rope's
        assert max(units) - min(units) <= 1
    # the order the encodings were listed in and unrelated flags do not move a cell
    other = load_config("configs/ci.yaml", {"seeds": [2, 0, 1], "train.steps": 7, "out": "elsewhere", "encodings": [
        "t5", "rope+sw16", "alibi", "nope+sw16", "rope-linear", "rope"]})
    assert all(set(shard_cells(cells, i, 4)) == set(shard_cells(other.cells(), i, 4)) for i in (1, 2, 3, 4))


@pytest.mark.parametrize("text, expected", [("1/1", (1, 1)), ("3/16", (3, 16)), (" 2 / 3 ", (2, 3))])
def test_parse_shard(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("value", ["0/0", "4/3", "0/3", "abc", "1/", "1.5/3"])
def test_bad_shard_is_one_clear_line_and_exit_2(value, capsys, tmp_path):
    assert main(["run", *TINY, "--shard", value, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--shard {value!r}" in err and "e.g. 3/16" in err
    assert not (tmp_path / "x").exists()


def test_more_shards_than_models_leaves_a_shard_empty_and_says_so(sweeps, tmp_path, capsys):
    data = ["--data", str(sweeps / "corpus"), "--set", "data.test_fraction=0.3", "--set", "data.valid_fraction=0"]
    assert main(["run", *TINY, *data, "--shard", "5/5", "--out", str(tmp_path)]) == 0  # 4 models, 5 shards
    assert "shard 5 of 5 has no cells" in capsys.readouterr().out
    assert json.loads((tmp_path / "results.shard-5-of-5.json").read_text())["records"] == []


def test_fresh_on_a_shard_removes_only_that_shard(sweeps, tmp_path):
    import shutil

    shared = tmp_path / "shared"
    shutil.copytree(sweeps / "shared", shared)
    from posenc_bench.bench.sweep import remove_outputs

    cfg = load_config(str(sweeps / "single" / "config.yaml"))
    remove_outputs(shared, cfg, (2, 3))
    assert sorted(p.name for p in shared.glob("results.shard-*")) == ["results.shard-1-of-3.json", "results.shard-3-of-3.json"]
    gone = {f"{r}-seed{s}" for r, s in {training_unit(*c) for c in shard_cells(cfg.cells(), 2, 3)}}
    left = {p.name for p in (shared / "checkpoints").iterdir()}
    assert len(gone) == 1 and not gone & left and len(left) == 3
    for i in (1, 3):  # the other shards' files are untouched
        assert (shared / f"results.shard-{i}-of-3.json").read_bytes() == \
            (sweeps / "shared" / f"results.shard-{i}-of-3.json").read_bytes()
