"""`posenc-bench eval` (bench/eval/pretrained.py): pretrained Hugging Face models and our own checkpoints through the
same protocol: the results schema, reruns and refusals, rows a model cannot give (n/a), zero-shot fixes that
reuse the model's numbers, long documents, and bad input as one line."""

import json
import math
from unittest.mock import patch

import pytest
import torch

from posenc_bench.bench.eval import pretrained
from posenc_bench.commands.cli import main
from posenc_bench.hf import rope as hf_rope

from tests.hf.hf_tiny import save_gpt2, save_llama

EVAL = ["--eval-tokens", "384", "--progress", "off"]


@pytest.fixture
def model(hf_model):
    """The session's tiny Llama (tests/conftest.py), under the name these tests use."""
    return hf_model


def test_results_have_the_run_schema_and_report_reads_them(llama_eval):
    from posenc_bench.analysis.report import results_markdown

    data, out = llama_eval
    rows = ["hf:tiny-llama"] + [f"hf:tiny-llama+{s}" for s in hf_rope.SCALINGS]
    assert data["run"]["rows"] == rows
    assert {(r["encoding"], r["eval_len"]) for r in data["records"]} == {(r, L) for r in rows for L in (32, 48, 128)}
    required = {"encoding", "seed", "train_len", "eval_len", "ratio", "status", "reason", "ppl", "bpb", "loss",
                "tokens", "bytes", "loss_by_position", "eval_time_s", "eval_fingerprint", "corpus_fingerprint",
                "versions", "device", "git_commit", "rope_parameters"}
    assert all(required <= set(r) and r["status"] == "ok" for r in data["records"])
    assert len({r["tokens"] for r in data["records"]}) == 1  # the same targets at every length and row
    m = data["run"]["model"]
    assert m["class"] == "LlamaForCausalLM" and m["files_sha256"] and m["dtype"] == "float32" and m["chunked_head"]
    assert data["run"]["versions"]["transformers"] and data["run"]["git_commit"]
    ppl = {(r["encoding"], r["eval_len"]): r["ppl"] for r in data["records"]}
    for s in hf_rope.SCALINGS:  # factor 1 at the train length: every scaling is the unscaled model
        assert ppl[(f"hf:tiny-llama+{s}", 32)] == pytest.approx(ppl[("hf:tiny-llama", 32)], rel=1e-6)
        assert ppl[(f"hf:tiny-llama+{s}", 128)] != pytest.approx(ppl[("hf:tiny-llama", 128)], rel=1e-4)
    reused = {r["encoding"] for r in data["records"] if r.get("same_as")}
    assert {"hf:tiny-llama+linear", "hf:tiny-llama+dynamic"} <= reused  # bit-identical frequencies at 1x
    assert all(r["eval_len"] == 32 for r in data["records"] if r.get("same_as"))
    params = {r["encoding"]: r["rope_parameters"] for r in data["records"] if r["eval_len"] == 128}
    assert params["hf:tiny-llama"] is None
    assert params["hf:tiny-llama+yarn"] == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 32}
    table = (out / "table.md").read_text()
    assert "| hf:tiny-llama+llama3  |" in table and "Pretrained LlamaForCausalLM" in table
    assert table == results_markdown(data)


def test_rerun_skips_finished_rows_and_refuses_another_model(llama_eval, llama_dir, tokenizer, tmp_path, capsys):
    data, out = llama_eval
    before = (out / "results.json").read_text()
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,1.5,4x", "--rope-scaling", "linear",
                 "--out", str(out), *EVAL]) == 0
    assert capsys.readouterr().out.count("done before, skipped") == 2
    after = json.loads((out / "results.json").read_text())
    assert after["records"] == json.loads(before)["records"]  # nothing redone, no row lost
    assert after["run"]["rows"] == data["run"]["rows"]
    mid = (out / "results.json").read_text()
    other = save_llama(tmp_path / "other-llama", tokenizer, seed=1)
    assert main(["eval", "--model", f"hf:{other}", "--eval-lens", "1,1.5,4x", "--out", str(out), *EVAL]) == 2
    err = capsys.readouterr().err
    assert "write this run to another folder with --out" in err and "--fresh" not in err  # no destructive hint
    assert (out / "results.json").read_text() == mid  # refused before writing anything


def test_gpt2_gets_na_for_scalings_and_past_its_table(tokenizer, tmp_path):
    d = save_gpt2(tmp_path / "tiny-gpt2", tokenizer, max_positions=32)
    out = tmp_path / "out"
    assert main(["eval", "--model", f"hf:{d}", "--eval-lens", "1,2x", "--rope-scaling", "linear,yarn",
                 "--out", str(out), *EVAL]) == 0
    recs = {(r["encoding"], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    assert recs[("hf:tiny-gpt2", 32)]["status"] == "ok" and recs[("hf:tiny-gpt2", 32)]["ppl"] > 1
    assert recs[("hf:tiny-gpt2", 64)]["status"] == "n/a"
    assert "absolute position table of 32 positions" in recs[("hf:tiny-gpt2", 64)]["reason"]
    for s in ("linear", "yarn"):
        for L in (32, 64):
            r = recs[(f"hf:tiny-gpt2+{s}", L)]
            assert r["status"] == "n/a" and "no rotary position embedding" in r["reason"] and r["ppl"] is None
    assert "n/a [1]" in (out / "table.md").read_text()


def test_own_checkpoint_gives_the_numbers_run_wrote(tmp_path):
    run_out = tmp_path / "run"
    micro = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "32", "--steps", "8", "--eval-tokens", "1024",
             "--progress", "off"]
    assert main(["run", *micro, "--encodings", "rope", "--eval-lens", "1,2x", "--out", str(run_out)]) == 0
    ran = json.loads((run_out / "results.json").read_text())["records"]
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run_out / "checkpoints" / "rope-seed0"), "--rope-scaling",
                 "linear,yarn,rerope,selfextend,sink2+sw30", "--out", str(out), "--progress", "off"]) == 0
    evaluated = json.loads((out / "results.json").read_text())
    got = evaluated["records"]
    # the documents scored, as run records them
    assert evaluated["run"]["eval_documents"] == json.loads((run_out / "results.json").read_text())["run"]["eval_documents"]
    assert sum(evaluated["run"]["eval_documents"].values()) == got[0]["tokens"]
    by_row = {}
    for r in got:
        by_row.setdefault(r["encoding"], {})[r["eval_len"]] = r
    assert set(by_row) == {"rope", "rope-linear", "rope-yarn", "rope-rerope", "rope-selfextend", "rope+sink2+sw30"}
    # the zero-shot fixes: plain rope where they change nothing (Self-Extend and sinks at 1x), their own rule past it
    for row in ("rope-selfextend", "rope+sink2+sw30"):
        assert by_row[row][32]["ppl"] == by_row["rope"][32]["ppl"] and by_row[row][64]["ppl"] != by_row["rope"][64]["ppl"]
    assert by_row["rope-rerope"][32]["ppl"] != by_row["rope"][32]["ppl"]  # w = 4 < 32: clipped at 1x already
    for r in ran:
        mine = by_row["rope"][r["eval_len"]]
        assert (mine["ppl"], mine["bpb"], mine["tokens"], mine["eval_fingerprint"]) == (
            r["ppl"], r["bpb"], r["tokens"], r["eval_fingerprint"])
    assert by_row["rope-linear"][32]["ppl"] == by_row["rope"][32]["ppl"]  # the registered rope-linear variant
    yarn = by_row["rope-yarn"]  # the registered rope-yarn variant: plain rope at 1x, scaled at 2x
    assert yarn[32]["ppl"] == by_row["rope"][32]["ppl"] and yarn[64]["ppl"] != by_row["rope"][64]["ppl"]


def test_own_checkpoint_on_the_valid_split_scores_other_text_under_its_own_key(tmp_path, capsys):
    run_out = tmp_path / "run"
    micro = ["--config", "configs/ci.yaml", "--seeds", "0,1", "--train-len", "32", "--steps", "8", "--eval-tokens", "1024",
             "--progress", "off", "--encodings", "rope", "--eval-lens", "1x"]
    assert main(["run", *micro, "--out", str(run_out)]) == 0
    test = json.loads((run_out / "results.json").read_text())["records"][0]
    ckpt = str(run_out / "checkpoints" / "rope-seed0")
    out = tmp_path / "valid"
    assert main(["eval", "--model", ckpt, "--split", "valid", "--out", str(out), "--progress", "off"]) == 0
    assert "of the valid split" in capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    valid = data["records"][0]
    assert data["run"]["config"]["eval"]["split"] == "valid"
    assert valid["cell_key"] == test["cell_key"]  # the same model ...
    assert valid["eval_key"] != test["eval_key"] and valid["ppl"] != test["ppl"]  # ... on other text, keyed apart
    assert set(data["run"]["eval_documents"]).isdisjoint(json.loads((run_out / "results.json").read_text())["run"]["eval_documents"])
    table = (out / "table.md").read_text()
    assert "valid tokens scored at every length" in table and "(valid loss early vs late" in table
    assert data["run"]["config"]["seeds"] == [0] and "; seeds 0;" in table
    assert main(["eval", "--model", ckpt, "--split", "all", "--out", str(tmp_path / "all"), "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert "--split all" in err and "valid splits for a checkpoint: test, valid, train" in err and "\n" not in err.strip()


@pytest.mark.parametrize("argv, message", [
    (["--model", "hf:/no/such/folder"], "is not a folder"),
    (["--model", "results/nothing-here"], "expected hf:"),
    (["--model", "hf:x.gguf"], "no GGUF file"),
    (["--model", "hf:{llama}", "--rope-scaling", "yarn,sink4"], "--rope-scaling sink4: a Hugging Face model was trained without"),
    (["--model", "hf:{llama}", "--unit", "200"], "--unit 200: the resampling unit is 1 .. the longest eval length 128"),
    (["--model", "hf:{llama}", "--rope-scaling", "bogus"], "valid: linear, dynamic, yarn, llama3, ntk, rerope, leaky, selfextend, string, sink<S>+sw<W>"),
    (["--model", "hf:{llama}", "--precision", "fp8"], "valid: fp32, bf16, fp16"),
    (["--model", "hf:{llama}", "--doc-sep", "<nope>"], "is not a token of this tokenizer"),
    (["--model", "hf:{llama}", "--doc-sep", "auto"], "give separator, eos, lm-eval, none, or a token such as"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, llama_dir, tmp_path, capsys):
    argv = [a.replace("{llama}", str(llama_dir)) for a in argv]
    assert main(["eval", *argv, "--out", str(tmp_path / "o"), *EVAL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc-bench eval: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_doc_sep_is_refused_for_our_checkpoints():
    """Our byte-level models put BOS before each document, as they were trained: --doc-sep is a Hugging Face
    model's, and a checkpoint refuses it rather than ignore it."""
    from types import SimpleNamespace

    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.eval.pretrained import EvalOptions, _checkpoint_config
    from posenc_bench.errors import ConfigError

    ckpt = SimpleNamespace(config=RunConfig(), path="results/x/checkpoints/rope-seed0")
    with pytest.raises(ConfigError, match="^--doc-sep applies to Hugging Face models"):
        _checkpoint_config(ckpt, EvalOptions(model="results/x/checkpoints/rope-seed0", doc_sep="eos"))


def test_a_checkpoint_of_a_tuned_run_is_evaluated_untuned_under_the_untuned_key():
    """`eval` scores a row at its options (tuning is `run`'s): a checkpoint whose run tuned its fixes gets the
    eval key of an untuned run, not one holding the grids."""
    from types import SimpleNamespace

    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.eval.pretrained import EvalOptions, _checkpoint_config
    from posenc_bench.bench.keys import eval_key
    from posenc_bench.bench.rows import Row

    tuned = RunConfig()
    tuned.eval.tune = True
    tuned.eval.key_tokens.evaluator = "rope"  # key tokens are `run`'s too: the eval scores none
    tuned.train.train_len = 32
    ckpt = SimpleNamespace(config=tuned, path="results/x/checkpoints/rope-seed0", meta={"seed": 0})
    cfg = _checkpoint_config(ckpt, EvalOptions(model="results/x/checkpoints/rope-seed0"))
    untuned = RunConfig()
    untuned.train.train_len = 32
    assert cfg.eval.tune is False and cfg.eval.key_tokens.evaluator == ""
    assert eval_key(cfg, Row("rope-rerope")) == eval_key(untuned, Row("rope-rerope"))


def test_a_pretrained_row_is_on_disk_before_its_summary_line_is_printed(llama_dir, tmp_path, monkeypatch):
    """As for `run`: a long eval stopped right after a row's line is logged keeps that row."""

    out, seen = tmp_path / "out", []

    def summary(row, records):
        saved = json.loads((out / "results.json").read_text())["records"]
        seen.append((row, sum(r["encoding"] == row for r in saved)))
        return f"  {row}"

    monkeypatch.setattr(pretrained, "summary_line", summary)
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,2x", "--rope-scaling", "linear",
                 "--out", str(out), *EVAL]) == 0
    assert [n for _, n in seen] == [2, 2] and seen[1][0].endswith("+linear")


def test_eval_rows_of_fixes_reuse_the_model_where_they_are_the_identity(model, tmp_path):
    out = tmp_path / "o"
    assert main(["eval", "--model", f"hf:{model.spec.ref}", "--eval-lens", "1,2x", "--eval-tokens", "128",
                 "--rope-scaling", "selfextend,rerope,sink4+sw28", "--out", str(out), "--progress", "off"]) == 0
    recs = {(r["encoding"].split("+", 1)[-1], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    base = {L: recs[(r, L)] for (r, L) in recs if r.startswith("hf:")}
    assert recs[("selfextend", 32)]["same_as"] and recs[("selfextend", 32)]["ppl"] == base[32]["ppl"]
    assert recs[("sink4+sw28", 32)]["same_as"]
    assert not recs[("rerope", 32)].get("same_as")  # active from w = 16 on
    for key in (("selfextend", 64), ("rerope", 64), ("sink4+sw28", 64)):
        rec = recs[key]
        assert not rec.get("same_as") and rec["ppl"] != base[64]["ppl"] and math.isfinite(rec["ppl"])
        assert rec["rerouted"]["encoding"] in ("rope-selfextend", "rope-rerope", "rope+sink4+sw28")
    # the LongLM README's rules at L = 32, N = 64: W = 3L/8 = 12 and the smallest G with 12 + 52 / G < 2/3 x 32
    rerouted = recs[("selfextend", 64)]["rerouted"]
    assert (rerouted["group"], rerouted["neighbor_window"]) == (6, 12)
    assert base[64]["peak_memory_bytes"] > 0 and base[64]["peak_memory_kind"] == "process peak RSS"
    assert base[64]["documents_per_window"] >= 1.0


def test_long_docs_keep_only_documents_longer_than_a_segment(model, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, words in enumerate((20, 150, 30, 200)):  # 51, 431, 81, 575 tokens with the separator
        (folder / f"d{i}.txt").write_text(" ".join(f"w{k % 97}" for k in range(words)))
    out = tmp_path / "o"
    assert main(["eval", "--model", f"hf:{model.spec.ref}", "--data", str(folder / "*.txt"), "--split", "all",
                 "--long-docs", "--eval-lens", "1,8x", "--eval-tokens", "768", "--out", str(out), "--progress", "off"]) == 0
    res = json.loads((out / "results.json").read_text())
    # segments of 256 tokens: one from the 431-token document, two from the 575-token one, none from the others
    assert res["run"]["config"]["eval"]["long_docs"] and res["run"]["eval_documents"] == {"d1.txt": 256, "d3.txt": 512}
    assert {r["documents_per_window"] for r in res["records"]} == {1.0}
    assert {tuple(r["units"]["doc"]) for r in res["records"]} == {(0, 1, 1)}  # units of 256: one per segment
    # the backfill of a folder made before units named documents rebuilds them through the tokenizer alone
    from posenc_bench.bench.eval.documents import backfill, without_documents

    old = without_documents(res)
    (out / "results.json").write_text(json.dumps(old, indent=1) + "\n")
    assert backfill(out).outcome == "written"
    assert json.loads((out / "results.json").read_text()) == res


def test_long_docs_without_a_long_enough_document_is_one_line_and_exit_2(model, tmp_path, capsys):
    (tmp_path / "short.txt").write_text("a few words only")
    assert main(["eval", "--model", f"hf:{model.spec.ref}", "--data", str(tmp_path / "*.txt"), "--split", "all",
                 "--long-docs", "--eval-tokens", "64", "--out", str(tmp_path / "o"), "--progress", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has 385 tokens (--long-docs" in err and "--split all" not in err and "\n" not in err


# a micro run of the -ft rows (tests/bench/config/test_finetune.py: their plan)
FT_MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "16", "--steps", "20", "--eval-tokens", "512",
            "--eval-lens", "1,2,4x", "--progress", "off"]


def test_eval_of_a_fine_tuned_checkpoint_gives_the_numbers_run_wrote(tmp_path):
    out = tmp_path / "out"
    assert main(["run", *FT_MICRO, "--encodings", "rope-linear-ft", "--out", str(out)]) == 0
    ran = {r["eval_len"]: r["ppl"] for r in json.loads((out / "results.json").read_text())["records"]}
    assert main(["eval", "--model", str(out / "checkpoints" / "rope-linear-ft-seed0"), "--out", str(tmp_path / "e"),
                 "--progress", "off"]) == 0
    got = {r["eval_len"]: r["ppl"] for r in json.loads((tmp_path / "e" / "results.json").read_text())["records"]}
    assert got == ran  # the fixed s = 64 / 16 at every length, as in run


def _lm_eval_rolling_loglikelihood(model, tokens: list[int], prefix: int, max_len: int) -> float:
    """lm-evaluation-harness's ``loglikelihood_rolling`` of one document (EleutherAI/lm-evaluation-harness at
    4e7e0d4), transcribed: ``lm_eval/utils.py`` ``get_rolling_token_windows(token_list, prefix_token,
    max_seq_len, context_len=1)`` and ``make_disjoint_window``, each window scored as HFLM's
    ``_loglikelihood_tokens`` does (``lm_eval/models/huggingface.py``: the input is (context + continuation)
    [-(max_len + 1):][:-1], the continuation scored by the last len(continuation) log-softmax rows). The sum
    of the document's log-likelihoods."""
    import torch

    def rolling_windows(token_list, prefix_token, max_seq_len, context_len):
        pred_len = max_seq_len - context_len + 1
        predicted = 0
        first_seq_len = min(max_seq_len, len(token_list))
        yield [prefix_token] + token_list[: first_seq_len - 1], token_list[:first_seq_len]
        predicted += first_seq_len
        while predicted < len(token_list):
            window_pred_len = min(len(token_list) - predicted, pred_len)
            window_end = predicted + window_pred_len
            yield (token_list[window_end - max_seq_len - 1 : window_end - 1],
                   token_list[window_end - window_pred_len : window_end])
            predicted += window_pred_len

    def disjoint(pair):
        a, b = pair
        return a[: len(a) - (len(b) - 1)], b

    total = 0.0
    with torch.no_grad():
        for context, continuation in map(disjoint, rolling_windows(tokens, prefix, max_len, 1)):
            inp = torch.tensor([(context + continuation)[-(max_len + 1):][:-1]])
            logp = torch.log_softmax(model(inp).logits.double(), dim=-1)[0, -len(continuation):]
            total += float(logp[torch.arange(len(continuation)), torch.tensor(continuation)].sum())
    return total


def test_the_lm_eval_prefix_gives_lm_evals_rolling_perplexity(llama_dir, tokenizer, tmp_path):
    """``--doc-sep lm-eval`` on one document of S tokens (``--long-docs``, lengths dividing S) gives the perplexity
    of lm-evaluation-harness's ``loglikelihood_rolling`` of that document with a max length of the eval length,
    exp(-sum / its tokens), to 1e-6: lm-eval's windows, written out above, are ours. Its prefix is the
    tokenizer's bos (<s>); our default, the pretraining separator, is </s> here (the tokenizer adds no bos),
    equal to lm-eval's algorithm with </s> as its prefix and another number."""
    import sysconfig
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    S = 96
    text = (Path(sysconfig.get_paths()["stdlib"]) / "colorsys.py").read_text()
    doc = tokenizer(text, add_special_tokens=False)["input_ids"][:S]
    (tmp_path / "doc.txt").write_text(tokenizer.decode(doc))
    assert tokenizer(tokenizer.decode(doc), add_special_tokens=False)["input_ids"] == doc  # one document of S tokens
    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    got = {}
    for choice, prefix in (("lm-eval", "<s>"), ("separator", "</s>")):
        out = tmp_path / choice
        assert main(["eval", "--model", f"hf:{llama_dir}", "--data", str(tmp_path / "doc.txt"), "--split", "all",
                     "--long-docs", "--eval-lens", "1,1.5x", "--eval-tokens", str(S), "--doc-sep", choice,
                     "--out", str(out), "--progress", "off"]) == 0
        data = json.loads((out / "results.json").read_text())
        assert data["run"]["segment_len"] == S and data["run"]["doc_separator"].startswith(f"{choice} {prefix!r}")
        for rec in data["records"]:  # windows of 32 and 48 tokens: 3 and 2 of them
            assert rec["tokens"] == S and rec["doc_separator"] == data["run"]["doc_separator"]
            prefix_id = tokenizer.convert_tokens_to_ids(prefix)
            lm_eval = _lm_eval_rolling_loglikelihood(model, doc, prefix_id, rec["eval_len"])
            assert rec["ppl"] == pytest.approx(math.exp(-lm_eval / S), rel=1e-6), (choice, rec["eval_len"])
            got[choice, rec["eval_len"]] = rec["ppl"]
    assert got["lm-eval", 32] != pytest.approx(got["separator", 32], rel=1e-4)  # the first target's context differs


def test_separators_between_joined_documents_are_context_never_targets(llama_dir, tokenizer, tmp_path):
    """Without --long-docs the documents are joined, each after its separator (</s> here). The separator is fed to
    the model but is no target: a hand computation with transformers' own loss on the same windows, the
    separators' labels ignored (-100), gives our ppl; targets, bytes, documents and the run's eval tokens count
    the documents' tokens alone."""
    import torch
    from transformers import AutoModelForCausalLM

    texts = [" ".join(f"w{(k * 7 + i) % 97}" for k in range(20)) for i in range(4)]
    for i, text in enumerate(texts):
        (tmp_path / f"d{i}.txt").write_text(text)
    out = tmp_path / "o"
    assert main(["eval", "--model", f"hf:{llama_dir}", "--data", str(tmp_path / "d*.txt"), "--split", "all",
                 "--eval-lens", "1,2x", "--eval-tokens", "128", "--out", str(out), "--progress", "off"]) == 0
    data = json.loads((out / "results.json").read_text())
    sep = tokenizer.convert_tokens_to_ids("</s>")
    stream, labels, owner = [], [], []
    for i, text in enumerate(texts):  # the stream as the hand makes it: [sep] + the document's own tokens
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        stream += [sep] + ids
        labels += [-100] + ids
        owner += [i] * (1 + len(ids))
    S = 64
    seg = torch.tensor([stream[k * S : k * S + S + 1] for k in range(2)])
    lab = torch.tensor([labels[k * S : k * S + S + 1] for k in range(2)])
    held = (lab[:, 1:] != -100).sum().item()
    assert held < 128  # separators fall among the targets: the case in hand
    run = data["run"]
    assert run["eval_tokens"] == held and sum(run["eval_documents"].values()) == held
    targets = [owner[k * S + j] for k in range(2) for j in range(1, S + 1) if labels[k * S + j] != -100]
    assert run["eval_documents"] == {f"d{i}.txt": targets.count(i) for i in dict.fromkeys(targets)}
    assert "never a scored target" in (out / "table.md").read_text()
    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    for rec in data["records"]:
        L, total, count = rec["eval_len"], 0.0, 0
        with torch.no_grad():
            for start in range(0, S, L):
                ids, y = seg[:, start : start + L + 1], lab[:, start : start + L + 1]  # transformers shifts labels
                n = int((y[:, 1:] != -100).sum())
                total += float(model(ids, labels=y).loss) * n
                count += n
        assert rec["tokens"] == count == held
        assert rec["ppl"] == pytest.approx(math.exp(total / count), rel=1e-5)
        assert rec["bytes"] == sum(len(tokenizer.decode([t])) for t in lab[:, 1:].flatten().tolist() if t != -100)


def test_key_tokens_give_every_row_longppl_on_the_evaluators_key_tokens(llama_dir, tmp_path, capsys):
    """--key-tokens yarn: the yarn row is the evaluator of every row; records past 1x carry key_nll and key_tokens
    per unit (the same count for every row), none at 1x; the rule is in the run's config and in every eval key."""
    out = tmp_path / "keys"
    argv = ["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,2x", "--rope-scaling", "yarn", *EVAL,
            "--eval-tokens", "192"]
    assert main([*argv, "--out", str(out), "--key-tokens", "yarn", "--key-beta", "-8", "--key-stride", "8"]) == 0
    data = json.loads((out / "results.json").read_text())
    rule = data["run"]["config"]["eval"]["key_tokens"]
    assert (rule["evaluator"], rule["beta"], rule["short_window"], rule["short_stride"]) == (
        "hf:tiny-llama+yarn", -8.0, 32, 8)
    at = {(r["encoding"], r["eval_len"]): r for r in data["records"]}
    for row in ("hf:tiny-llama", "hf:tiny-llama+yarn"):
        assert "key_nll" not in at[row, 32]["units"]  # no key tokens at 1x
        assert at[row, 64]["key_evaluator"] == "hf:tiny-llama+yarn"
    counts = at["hf:tiny-llama", 64]["units"]["key_tokens"]
    assert counts == at["hf:tiny-llama+yarn", 64]["units"]["key_tokens"] and 0 < sum(counts)
    assert main(["report", str(out), "--value", "longppl,key_share"]) == 0
    assert "Key-token perplexity, LongPPL" in capsys.readouterr().out
    kept = torch.load(out / "key_tokens.pt", weights_only=True)  # the evaluator's passes, kept in the folder
    assert list(kept["masks"]) == [64] and kept["short"] is not None
    (out / "results.json").unlink()  # rows measured again (as a row stopped part way): the key tokens are read back
    with patch.object(pretrained._HFRows, "evaluator_nll", side_effect=AssertionError("an evaluator pass ran")):
        assert main([*argv, "--out", str(out), "--key-tokens", "yarn", "--key-beta", "-8", "--key-stride", "8"]) == 0
    again = json.loads((out / "results.json").read_text())["records"]
    assert [r["units"].get("key_nll") for r in again] == [r["units"].get("key_nll") for r in data["records"]]
    plain = tmp_path / "plain"
    assert main([*argv, "--out", str(plain)]) == 0
    without = json.loads((plain / "results.json").read_text())
    assert {r["eval_key"] for r in without["records"]}.isdisjoint({r["eval_key"] for r in data["records"]})
    assert all("key_nll" not in r["units"] and "key_evaluator" not in r for r in without["records"])
    assert [r["ppl"] for r in without["records"]] == pytest.approx([r["ppl"] for r in data["records"]], rel=1e-9)


def test_key_tokens_name_a_row_of_the_eval(llama_dir, tmp_path, capsys):
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,2x", "--key-tokens", "yarn",
                 "--out", str(tmp_path / "o"), *EVAL]) == 2
    err = capsys.readouterr().err
    assert "the evaluator 'yarn' is not a row of this eval; valid: model, hf:tiny-llama" in err


def test_tune_chooses_each_fix_on_valid_and_scores_the_split_at_the_choice(llama_dir, tmp_path, capsys):
    """--tune: a row with a grid at a length is scored at the point with the lowest valid ppl (the earliest on a
    tie), each point's valid value being what an untuned eval of that point on --split valid gives; rows and
    lengths without a grid keep their untuned numbers and keys; the caption says what was chosen."""
    argv = ["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,2x", *EVAL, "--eval-tokens", "128",
            "--rope-scaling", "yarn,rerope,selfextend,sink4+sw28,linear"]
    runs = {}
    for name, extra in (("tuned", ["--tune"]), ("test", []), ("valid", ["--split", "valid"])):
        assert main([*argv, *extra, "--out", str(tmp_path / name)]) == 0
        data = json.loads((tmp_path / name / "results.json").read_text())
        runs[name] = {(r["encoding"].split("+", 1)[-1], r["eval_len"]): r for r in data["records"]}
    tuned, test, valid = runs["tuned"], runs["test"], runs["valid"]
    assert {k for k, r in tuned.items() if r.get("tuning")} == {("yarn", 64), ("rerope", 32), ("rerope", 64),
                                                                ("selfextend", 64), ("sink4+sw28", 64)}
    for key, rec in tuned.items():
        t = rec.get("tuning")
        if t is None:  # nothing to tune there: the untuned numbers; a row tuned at no length keeps its key
            assert rec["ppl"] == test[key]["ppl"]
            assert (rec["eval_key"] == test[key]["eval_key"]) == (key[0] in ("hf:tiny-llama", "linear"))
            continue
        assert rec["eval_key"] != test[key]["eval_key"] and t["split"] == "valid" and t["metric"] == "ppl"
        assert t["values"][0] == pytest.approx(valid[key]["ppl"], rel=1e-6)  # the default point, on valid
        best = min(v for v in t["values"] if v is not None)
        assert t["chosen_index"] == t["values"].index(best) and t["chosen"] == t["grid"][t["chosen_index"]]
        if t["chosen_index"] == 0:
            assert rec["ppl"] == pytest.approx(test[key]["ppl"], rel=1e-6)
        if key[0] == "sink4+sw28":  # the count is in the row's name: S' sinks and a window of 32 - S'
            assert rec["rerouted"]["encoding"] == "rope+sink{sinks}+sw{window}".format(**t["chosen"])
        else:
            chosen_in_record = rec["rope_parameters"] if key[0] == "yarn" else rec["rerouted"]
            assert all(chosen_in_record[k] == v for k, v in t["chosen"].items())
    assert tuned["yarn", 64]["tuning"]["grid"][0] == {"beta_fast": 32.0, "beta_slow": 1.0}  # the authors' first
    assert len(tuned["yarn", 64]["tuning"]["values"]) == len(tuned["yarn", 64]["tuning"]["grid"]) > 1
    table = (tmp_path / "tuned" / "table.md").read_text()
    assert "Tuned on the valid split" in table and "hf:tiny-llama+rerope window: 1x from" in table
    assert main([*argv, "--tune", "--out", str(tmp_path / "tuned")]) == 0  # resumed: every row finished
    assert capsys.readouterr().out.count("done before, skipped") == 6


def test_tune_refuses_a_scored_split_that_holds_the_valid_documents(llama_dir, tmp_path, capsys):
    assert main(["eval", "--model", f"hf:{llama_dir}", "--rope-scaling", "yarn", "--tune", "--split", "all",
                 "--out", str(tmp_path / "o"), *EVAL]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tune chooses on the valid split" in err and "test, train, all-but-valid" in err and "'all'" in err
    assert "\n" not in err and not (tmp_path / "o").exists()


def test_an_interrupted_tuned_row_resumes_at_its_next_length_and_grid_point(llama_dir, tmp_path, monkeypatch, capsys):
    """A tuned row of a pretrained model is hours of CPU: stopped inside it, a rerun takes the lengths and valid
    passes it finished from eval.partial.json and measures only the rest, to the same records as a run that was
    never stopped; the results file never holds half a row, and the progress file goes once the row is whole."""
    from posenc_bench.bench.eval.progress import PARTIAL

    argv = ["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,1.5,2x", *EVAL, "--eval-tokens", "128",
            "--rope-scaling", "rerope", "--tune"]
    measure, calls = pretrained._HFRows._measure, []

    def counted(self, rec, scaling, L, point=None, text=None):
        calls.append((scaling, L, point and dict(point), text is not None))
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        return measure(self, rec, scaling, L, point, text)

    monkeypatch.setattr(pretrained._HFRows, "_measure", counted)
    stop_at = None
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    whole, every = json.loads((tmp_path / "whole" / "results.json").read_text()), list(calls)
    rerope = [c for c in every if c[0] == "rerope"]
    assert len(rerope) > 6 and not (tmp_path / "whole" / PARTIAL).exists()

    out = tmp_path / "stopped"
    stop_at = every.index(rerope[len(rerope) // 2 + 1]) + 1  # inside rerope: past a length, amid a grid
    calls.clear()
    assert main([*argv, "--out", str(out)]) == 130
    before = list(calls[:-1])  # the last call was stopped before it measured
    saved = json.loads((out / "results.json").read_text())["records"]
    assert {r["encoding"] for r in saved} == {"hf:tiny-llama"}  # no half row
    partial = json.loads((out / PARTIAL).read_text())["hf:tiny-llama+rerope"]
    assert partial["records"] and partial["valid"]

    stop_at = None
    calls.clear()
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 0
    assert "resuming: eval lengths" in capsys.readouterr().out
    assert sorted(map(repr, before + calls)) == sorted(map(repr, every))  # nothing measured twice, nothing skipped
    resumed = json.loads((out / "results.json").read_text())["records"]
    fields = ("encoding", "eval_len", "ppl", "loss", "eval_key", "tuning", "rerouted", "loss_by_position")
    assert [{k: r.get(k) for k in fields} for r in resumed] == [{k: r.get(k) for k in fields} for r in whole["records"]]
    assert not (out / PARTIAL).exists()
