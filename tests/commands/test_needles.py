"""`posenc-bench needles`: every row of a model on the same haystacks, resumable, with heat maps; its flags."""

import json
import re

from posenc_bench.bench.records import ResultsFolder
from posenc_bench.commands.cli import main

from tests.commands.cli_helpers import parsed


def test_defaults_are_the_librarys():
    from posenc_bench.bench.eval import needles

    args = parsed("needles")
    assert float(args.threshold) == needles.RULER_THRESHOLD and args.variants.split(",") == list(needles.VARIANTS)
    assert args.depths.split(",") == [f"{d:g}" for d in needles.DEFAULT_DEPTHS] and args.data == "sotu"
    assert args.out is None and args.rope_scaling == ""  # runs/needles-<model>, the model's own row only


def test_needles_on_a_hugging_face_model_every_row_resumes_and_draws_heat_maps(llama_dir, tmp_path, capsys):
    out, prose = tmp_path / "n", tmp_path / "prose.txt"
    prose.write_text(" ".join(f"The {who} of {where} {deed} in {year}." for who in ("committee", "council", "clerk")
                              for where in ("the harbor town", "the capital", "the old mill", "the county seat")
                              for deed in ("met on a Tuesday", "read the report aloud", "voted to adjourn")
                              for year in (1801, 1850, 1912)))
    argv = ["needles", "--model", f"hf:{llama_dir}", "--rope-scaling", "yarn,rerope", "--lengths", "16,32x",
            "--variants", "multikey,multivalue", "--depths", "0,1", "--data", str(prose), "--split", "all",
            "--out", str(out)]
    assert main(argv) == 0
    log = capsys.readouterr().out
    data = json.loads((out / "needles.json").read_text())
    assert [r["row"] for r in data["rows"]] == ["hf:tiny-llama", "hf:tiny-llama+yarn", "hf:tiny-llama+rerope"]
    assert data["haystack"]["source"] == str(prose) and data["haystack"]["split"] == "all"
    assert data["train_len"] == 32 and data["threshold"] == 0.856 and data["git_commit"]
    cells = {(v, L, d) for v in ("multikey", "multivalue") for L in (512, 1024) for d in (0.0, 1.0)}
    for row in data["rows"]:
        assert {(r["variant"], r["length"], r["depth"]) for r in row["records"]} == cells
        assert all(r["status"] == "ok" and r["needles"] == 1 and len(r["tried"]) == 1 for r in row["records"])
        assert row["effective_length"] in (None, 512, 1024)
    assert "hf:tiny-llama L=512 (one prefill per haystack)" in log
    assert "hf:tiny-llama+rerope L=512 (one prefill per haystack)" in log  # a fix caches its keys unrotated
    assert sorted(p.name for p in out.glob("*.png")) == [
        "needles-hf-tiny-llama+rerope.png", "needles-hf-tiny-llama+yarn.png", "needles-hf-tiny-llama.png"]
    md = (out / "needles.md").read_text()
    assert re.search(r"\| hf:tiny-llama\+yarn +\| [\d.]+% +\| [\d.]+% +\| ", md) and "effective length" in md
    assert re.search(r"; commit [0-9a-f]{12}(-dirty)?; device cpu:.+; with torch 2\.13\.0", md.splitlines()[0])
    assert main(argv) == 0  # resumed: every row kept, the same file
    assert capsys.readouterr().out.count("done before, kept") == 3
    assert json.loads((out / "needles.json").read_text())["rows"] == data["rows"]
    assert main([*argv, "--trials", "2"]) == 2
    assert "measured with another trials (1, now 2); use another --out" in capsys.readouterr().err
    assert main([*argv, "--threshold", "0.01"]) == 0  # another bar: the rows kept, their effective lengths anew
    again = json.loads((out / "needles.json").read_text())
    assert again["threshold"] == 0.01 and again["threshold_rule"] == "--threshold"
    assert [r["records"] for r in again["rows"]] == [r["records"] for r in data["rows"]]
    fewer = [a if a != "yarn,rerope" else "none" for a in argv]
    assert main(fewer) == 0  # rows of a longer --rope-scaling list stay in the folder
    assert [r["row"] for r in json.loads((out / "needles.json").read_text())["rows"]] == [r["row"] for r in data["rows"]]
    assert main([*argv, "--threshold", "1x"]) == 2  # 16,32x: the model's own length was not measured
    assert "--threshold 1x needs the model's own row measured at its train length 32" in capsys.readouterr().err
    with ResultsFolder(out, "needles.json"):  # another writer holds the folder: refused before anything runs
        assert main(argv) == 2
    assert f"{out} is being written by pid" in capsys.readouterr().err


def test_needles_on_our_checkpoint_runs_each_prompt_whole(tmp_path, capsys):
    """Our models have no KV cache: every question runs its whole prompt; a scaling is the checkpoint's
    zero-shot row (yarn -> rope-yarn)."""
    run = ["run", "--config", "configs/ci.yaml", "--seeds", "1", "--encodings", "rope", "--train-len", "256",
           "--steps", "2", "--eval-tokens", "600", "--set", "eval.lens=[1x]", "--out", str(tmp_path / "r"),
           "--progress", "off"]
    assert main(run) == 0
    out = tmp_path / "n"
    assert main(["needles", "--model", str(tmp_path / "r" / "checkpoints" / "rope-seed0"), "--rope-scaling", "yarn",
                 "--lengths", "4,8x", "--variants", "multikey", "--depths", "0,1", "--out", str(out)]) == 0
    log = capsys.readouterr().out
    data = json.loads((out / "needles.json").read_text())
    assert [r["row"].split(" ")[0] for r in data["rows"]] == ["rope", "rope-yarn"] and data["train_len"] == 256
    assert data["haystack"]["source"] == "sotu" and data["haystack"]["split"] == "test"  # the default: prose
    assert all(r["status"] == "ok" and r["needles"] == 1 for row in data["rows"] for r in row["records"])
    assert "L=1024:" in log and "one prefill" not in log
    assert sorted(p.name for p in out.glob("*.png")) == ["needles-rope-yarn.png", "needles-rope.png"]
