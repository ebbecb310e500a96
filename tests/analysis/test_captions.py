"""Captions say what was measured, with the commit and its dirty mark, and what kind of results a file holds."""

import json
from pathlib import Path

from tests.analysis.fake_results import RECORDS, run_meta
from posenc_bench.analysis.captions import caption, hf_caption, kind, kind_text, short_caption
from posenc_bench.bench.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]


def hf_run(**kw):
    """The run of the committed eval of a pretrained Hugging Face model (results/smollm2)."""
    return {**json.loads((ROOT / "results" / "smollm2" / "results.json").read_text())["run"], **kw}


def test_caption_states_what_was_measured_and_keeps_the_dirty_mark():
    run = {"config": RunConfig().to_dict(), "params": 821632, "corpus": {"source": "stdlib", "fingerprint": "abc"},
           "eval_tokens": 66048, "eval_fingerprint": "def", "device": "cpu:x86_64 (2 threads)",
           "versions": {"torch": "2.13.0+cpu"}, "git_commit": "0123456789abcdef0123-dirty"}
    text = caption(run)
    for fact in ("821,632 parameters", "4 layers, width 128, 4 heads", "400 steps x 32 x 128 tokens", "stdlib (abc)",
                 "66,048 test tokens", "seeds 0", "cpu:x86_64", "torch 2.13.0+cpu", "commit 0123456789ab-dirty"):
        assert fact in text, fact
    assert short_caption(run).endswith("; cpu:x86_64 (2 threads); commit 0123456789ab-dirty")


def test_caption_names_every_commit_when_rows_were_added_later():
    recs = [dict(r, git_commit="a" * 40) for r in RECORDS[:4]] + [dict(r, git_commit="b" * 40 + "-dirty") for r in RECORDS[4:6]]
    text = caption(run_meta(["rope", "learned"]), recs)
    assert text.endswith(f"commits {'a' * 12} (rope); {'b' * 12}-dirty (learned).")
    assert caption(run_meta(["rope"]), RECORDS[:4]).endswith("commit 0123456789ab.")  # records without commits
    assert short_caption(run_meta(["rope", "learned"]), recs).endswith(f"commits {'a' * 12}, {'b' * 12}-dirty")


def test_a_pretrained_models_caption_names_its_revision_and_keeps_the_dirty_mark():
    run = hf_run(git_commit="fedcba9876543210fedc-dirty")
    text = caption(run)
    assert text == hf_caption(run) and text.startswith("Pretrained LlamaForCausalLM ")
    for fact in ("SmolLM2-135M-Instruct.Q4_1.gguf (revision 0d2cd9a90e26aeea)", "134,515,008 parameters",
                 "train length 8192 (max_position_embeddings)", "tokenizer TokenizersBackend (vocab 49,152"):
        assert fact in text, fact
    assert text.endswith("; commit fedcba987654-dirty.")
    assert short_caption(run).endswith("; commit fedcba987654-dirty")
    assert caption(hf_run()).endswith("; commit 2566c9a77051.")


def test_a_pretrained_models_caption_names_its_document_prefix():
    """A run that records the --doc-sep it was asked for (config.eval.doc_sep) scored no separator; the caption of
    one made before (results/smollm2) stays as it was."""
    assert "(vocab 49,152, document separator eos '<|im_end|>' (between documents, GPT-2 style)); " in caption(hf_run())
    run = hf_run(doc_separator="separator '<|endoftext|>' (between pretraining documents; eos is '<|im_end|>')")
    run["config"] = {**run["config"], "eval": {**run["config"]["eval"], "doc_sep": "separator"}}
    assert ("(vocab 49,152, document prefix separator '<|endoftext|>' (between pretraining documents; eos is "
            "'<|im_end|>'), never a scored target); ") in caption(run)


def test_the_kind_of_results_in_words():
    checkpoint = {"kind": "eval", "model": {"kind": "checkpoint", "path": "results/default/checkpoints/rope-s0"}}
    assert kind(run_meta(["rope"])) == ("run", None) and kind(hf_run()) == ("eval", "hf")
    assert kind(checkpoint) == ("eval", "checkpoint")
    assert kind_text(run_meta(["rope"])) == "a training run (posenc-bench run)"
    assert kind_text(hf_run()) == "an eval of the Hugging Face model SmolLM2-135M-Instruct.Q4_1 (posenc-bench eval)"
    assert kind_text(checkpoint) == "an eval of the checkpoint results/default/checkpoints/rope-s0 (posenc-bench eval)"


def test_a_task_runs_figure_caption_names_the_task_sizes_and_instances_not_tokens():
    from tests.analysis.fake_results import arec, task_results

    data = task_results([arec("rope", 0, 100, [1, 0])])
    data["run"]["eval_instances"] = {"100": 40, "200": 40}
    text = short_caption(data["run"], data["records"])
    assert "\ntask copy (t), train sizes 1-100, 40 test instances per size; " in text
    assert "tokens per length" not in text


def test_parameters_are_one_number_when_rows_differ_by_less_than_the_rounding():
    run = run_meta(["rope", "t5", "learned"])
    run["params"] = {"rope": 115392, "t5": 115520, "learned": 180928}
    recs = [{"encoding": row} for row in ("rope", "t5")]
    assert "0.12M params" in short_caption(run, recs) and "0.12M-0.12M" not in short_caption(run, recs)
    assert "115,392-115,520 parameters" in caption(run, recs)  # the full caption keeps the exact range
    assert "0.12M-0.18M params" in short_caption(run, recs + [{"encoding": "learned"}])


def test_captions_name_the_split_scored():
    run = run_meta(["rope"])
    assert "test tokens scored" in caption(run)
    run["config"] = {**run["config"], "eval": {**run["config"]["eval"], "split": "valid"}}
    assert "valid tokens scored" in caption(run)
    assert "tokens of every document (108,267 bytes)" in caption(hf_run())  # results/smollm2: --split all


def test_a_tuned_rows_caption_prints_its_grid_choice_and_valid_numbers_and_untuned_results_print_none():
    from tests.analysis.fake_results import arec, task_results

    def tuned(seed, chosen, values):
        r = arec("rope-selfextend", seed, 400, [1, 0, 1, 1])
        grid = [{"group": g, "neighbor_window": w} for g, w in ((8, 10), (16, 10), (4, 7))]
        r["tuning"] = {"split": "valid", "metric": "accuracy", "higher_is_better": True, "grid": grid,
                       "values": values, "chosen": grid[chosen], "chosen_index": chosen}
        return r

    plain = [arec("rope", s, L, [1, 0]) for s in (0, 1) for L in (100, 400)]
    untuned = task_results(plain + [arec("rope-selfextend", s, 400, [1, 1]) for s in (0, 1)],
                           rows=("rope", "rope-selfextend"))
    assert "Tuned" not in caption(untuned["run"], untuned["records"])  # committed results: the defaults, as ever
    data = task_results(plain + [tuned(0, 0, [0.75, 0.5, 0.25]), tuned(1, 2, [0.25, 0.5, 0.75])],
                        rows=("rope", "rope-selfextend"))
    text = caption(data["run"], data["records"])
    assert text.startswith("Task copy") and " Tuned on the valid split (eval.tune" in text
    assert ("rope-selfextend (group, neighbor_window): 4x from (8, 10), (16, 10), (4, 7): (8, 10) on 1 of 2 seeds, "
            "(4, 7) on 1; valid accuracy 0.5, 0.5, 0.5.") in text
    assert "rope:" not in text.split("Tuned")[1]  # the trained row has no grid
    text_run = dict(data["run"], corpus={"source": "stdlib", "fingerprint": "abc"}, eval_tokens=100,
                    eval_fingerprint="e")
    assert "(8, 10) on 1 of 2 seeds" in caption(text_run, data["records"])  # the perplexity track's caption too


def test_an_untuned_text_table_names_its_zero_shot_rows_that_have_a_grid():
    """A row that --tune would choose for (a grid of two or more points at one of its lengths) says it is at its
    authors' defaults; a trained row, a scaling without a grid (llama3) or a tuned record does not; a task's
    caption leaves it to its folder's prose. The pretrained path: its scalings' rows (results/smollm2)."""
    from tests.analysis.fake_results import rec

    recs = [rec(row, 0, L, 3.0) for row in ("rope", "rope-yarn", "rope-llama3") for L in (100, 400)]
    text = caption(run_meta(["rope", "rope-yarn", "rope-llama3"]), recs)
    assert text.endswith(" Not tuned (authors' defaults; eval.tune off): rope-yarn.")
    only_1x = [r for r in recs if r["eval_len"] == 100]  # YaRN has no grid at 1x: nothing was left untuned
    assert "Not tuned" not in caption(run_meta(["rope", "rope-yarn"]), only_1x)
    tuned = [dict(r, tuning={"grid": [{"beta_fast": 32.0, "beta_slow": 1.0}, {"beta_fast": 16.0, "beta_slow": 1.0}],
                             "values": [1.0, 2.0], "chosen": {"beta_fast": 32.0, "beta_slow": 1.0}, "chosen_index": 0,
                             "metric": "ppl", "split": "valid", "higher_is_better": False})
             if r["encoding"] == "rope-yarn" and r["eval_len"] == 400 else r for r in recs]
    assert "Not tuned" not in caption(run_meta(["rope", "rope-yarn"]), tuned)
    smollm2 = json.loads((ROOT / "results" / "smollm2" / "results.json").read_text())
    assert caption(smollm2["run"], smollm2["records"]).endswith(
        " Not tuned (authors' defaults; eval.tune off): hf:SmolLM2-135M-Instruct.Q4_1+yarn, "
        "hf:SmolLM2-135M-Instruct.Q4_1+selfextend, hf:SmolLM2-135M-Instruct.Q4_1+rerope, "
        "hf:SmolLM2-135M-Instruct.Q4_1+leaky, hf:SmolLM2-135M-Instruct.Q4_1+sink4+sw8188.")


def test_a_caption_names_every_device_when_rows_ran_on_several_machines():
    """A run resumed on another machine: its header names the last machine alone, each record its own."""
    recs = [dict(r, device="cpu:A") for r in RECORDS[:4]] + [dict(r, device="cpu:B") for r in RECORDS[4:6]]
    run = run_meta(["rope", "learned"])
    assert "; devices cpu:A (rope); cpu:B (learned); torch " in caption(run, recs)
    assert f"; device {run['device']}; torch " in caption(run, RECORDS[:4])  # records without devices: the header's
    assert "; cpu:A, cpu:B; commit " in short_caption(run, recs)
    hf = hf_run()
    hf_recs = [{"encoding": "model", "device": "cpu:A"}, {"encoding": "model+yarn", "device": "cpu:B"}]
    assert "; devices cpu:A (model); cpu:B (model+yarn); torch " in caption(hf, hf_recs)
    assert "; cpu:A, cpu:B; commit " in short_caption(hf, hf_recs)
