"""The -ft rows: the trained rope model fine-tuned at a longer length with the row's scaling, cached, fair."""

import json

import pytest
import torch

from posenc_bench.commands.cli import main
from posenc_bench.bench.config import load_config
from posenc_bench.data import TrainBatches
from posenc_bench.errors import ConfigError

MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "16", "--steps", "20", "--eval-tokens", "512",
         "--eval-lens", "1,2,4x", "--progress", "off"]


def test_continued_batches_go_on_where_pre_training_stopped():
    stream = torch.arange(10_000) % 251
    pre = TrainBatches(stream, 16, 4, seed=3)
    after = pre.continued(5, train_len=64, batch_size=2)
    replay = TrainBatches(stream, 16, 4, seed=3)
    for _ in range(5):
        replay.next()
    starts = torch.randint(0, stream.numel() - 64 - 1, (2,), generator=replay.generator)
    expected = stream[starts[:, None] + torch.arange(65)[None, :]].long()
    assert torch.equal(after.next(), expected)
    assert torch.equal(pre.next(), TrainBatches(stream, 16, 4, seed=3).next())  # pre itself is untouched


def test_the_plan_defaults_to_a_tenth_of_pre_training_at_the_longest_length():
    cfg = load_config("configs/ci.yaml", {"encodings": ["rope", "rope-linear-ft"]})  # T=64, B=16, 300 steps
    plan = cfg.finetune_plan()
    assert (plan.steps, plan.len, plan.warmup_steps, plan.batch_size) == (30, 256, 3, 4)
    assert plan.lr == pytest.approx(3e-3 * 0.1)  # where pre-training's cosine ended
    assert plan.tokens == 30 * 4 * 256 == 0.1 * 300 * 16 * 64  # 10% of the pre-training tokens
    cfg = load_config("configs/ci.yaml", {"finetune.len": "2x", "finetune.steps": 7})
    assert (cfg.finetune_plan().len, cfg.finetune_plan().steps, cfg.finetune_plan().batch_size) == (128, 7, 8)
    with pytest.raises(ConfigError, match="finetune.len '1x' must be beyond the train length 64"):
        load_config("configs/ci.yaml", {"encodings": ["rope-ft"], "finetune.len": "1x"})


def test_fine_tuned_rows_continue_the_rope_checkpoint_and_are_cached(tmp_path, capsys):
    out = tmp_path / "out"
    rows = "rope,rope-ft,rope-linear-ft,rope-linear"
    assert main(["run", *MICRO, "--encodings", rows, "--out", str(out)]) == 0
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

    assert main(["run", *MICRO, "--encodings", rows, "--out", str(out)]) == 0  # finished: nothing redone
    assert "rope-linear-ft seed 0: done before, skipped" in capsys.readouterr().out
    assert main(["run", *MICRO, "--encodings", rows, "--out", str(out), "--finetune-steps", "3"]) == 0
    log = capsys.readouterr().out
    assert "rope seed 0: reusing checkpoint" in log and "rope-linear-ft seed 0: fine-tuned 3 steps" in log
    again = {(r["encoding"], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    assert again["rope", 16]["ppl"] == recs["rope", 16]["ppl"]  # untouched rows keep their numbers


def test_passkey_runs_a_fine_tuned_checkpoint_at_its_tuned_scaling(tmp_path):
    out = tmp_path / "out"
    assert main(["run", *MICRO, "--train-len", "256", "--steps", "2", "--eval-lens", "1,2x", "--encodings",
                 "rope-linear-ft", "--out", str(out)]) == 0
    from posenc_bench.bench.passkey import CheckpointLM

    lm = CheckpointLM(out / "checkpoints" / "rope-linear-ft-seed0")
    assert lm.model.encoding.tuned_len == 512 and lm.model.encoding.scale_for(256) == 2.0
    with pytest.raises(ConfigError, match="is fine-tuned: give its own checkpoint"):
        CheckpointLM(out / "checkpoints" / "rope-seed0", encoding="rope-linear-ft")


def test_eval_of_a_fine_tuned_checkpoint_gives_the_numbers_run_wrote(tmp_path):
    out = tmp_path / "out"
    assert main(["run", *MICRO, "--encodings", "rope-linear-ft", "--out", str(out)]) == 0
    ran = {r["eval_len"]: r["ppl"] for r in json.loads((out / "results.json").read_text())["records"]}
    assert main(["eval", "--model", str(out / "checkpoints" / "rope-linear-ft-seed0"), "--out", str(tmp_path / "e"),
                 "--progress", "off"]) == 0
    got = {r["eval_len"]: r["ppl"] for r in json.loads((tmp_path / "e" / "results.json").read_text())["records"]}
    assert got == ran  # the fixed s = 64 / 16 at every length, as in run
