from posenc_bench.report import markdown, ppl_table, training_table


def rec(enc, seed, L, ppl, status="ok", reason=""):
    return {"encoding": enc, "seed": seed, "train_len": 100, "eval_len": L, "ratio": L / 100, "status": status,
            "reason": reason, "ppl": ppl, "bpb": None, "loss": None, "tokens": 10}


RECORDS = [
    rec("rope", 0, 100, 4.0), rec("rope", 1, 100, 6.0), rec("rope", 0, 200, 8.0), rec("rope", 1, 200, 9.0),
    rec("learned", 0, 100, 5.0), rec("learned", 0, 200, None, "n/a", "table has 100 rows"),
    rec("bad", 0, 100, None, "diverged", "diverged at step 3"), rec("bad", 0, 200, None, "diverged", "diverged at step 3"),
]


def test_ppl_table_mean_std_and_footnotes():
    table, notes = ppl_table(RECORDS, row_order=["rope", "learned", "bad"])
    assert list(table.columns) == ["1x (100)", "2x (200)"]
    assert table.loc["rope", "1x (100)"] == "5.00 ± 1.41"
    assert table.loc["rope", "2x (200)"] == "8.50 ± 0.71"
    assert table.loc["learned", "2x (200)"] == "n/a [1]"
    assert table.loc["bad", "1x (100)"] == "diverged [2]"
    assert notes == ["[1] table has 100 rows", "[2] diverged at step 3"]
    text = markdown(table, notes, "caption")
    assert text.startswith("caption\n")
    assert "| rope       |  5.00 ± 1.41 |  8.50 ± 0.71 |" in text


def test_relative_table_divides_by_the_same_seed_at_1x():
    table, _ = ppl_table(RECORDS, relative=True, row_order=["rope"])
    # seed 0: 8/4 = 2.0, seed 1: 9/6 = 1.5 -> mean 1.75, std 0.35
    assert table.loc["rope", "2x (200)"] == "1.75 ± 0.35"
    assert table.loc["rope", "1x (100)"] == "1.00 ± 0.00"


def test_training_table_reads_curves_and_positions():
    r = rec("rope", 0, 100, 4.0)
    r["train_curve"] = [[10, 3.0], [20, 2.5], [30, 2.2], [40, 2.0]]
    r["loss_by_position"] = [{"start": 0, "end": 10, "loss": 2.0, "tokens": 5},
                             {"start": 50, "end": 60, "loss": 1.0, "tokens": 5},
                             {"start": 60, "end": 100, "loss": 1.5, "tokens": 5}]
    t = training_table([r])
    assert t.loc["rope", "train loss @ step 40"] == "2.000"
    assert t.loc["rope", "1x loss, positions 0-9"] == "2.000"
    assert t.loc["rope", "1x loss, positions 50-99"] == "1.250"


def test_caption_states_what_was_measured_and_keeps_the_dirty_mark():
    from posenc_bench.config import RunConfig
    from posenc_bench.report import caption

    run = {"config": RunConfig().to_dict(), "params": 821632, "corpus": {"source": "stdlib", "fingerprint": "abc"},
           "eval_tokens": 66048, "eval_fingerprint": "def", "device": "cpu:x86_64 (2 threads)",
           "versions": {"torch": "2.13.0+cpu"}, "git_commit": "0123456789abcdef0123-dirty"}
    text = caption(run)
    for fact in ("821,632 parameters", "4 layers, width 128, 4 heads", "400 steps x 32 x 128 tokens", "stdlib (abc)",
                 "66,048 test tokens", "seeds 0", "cpu:x86_64", "torch 2.13.0+cpu", "commit 0123456789ab-dirty"):
        assert fact in text, fact
