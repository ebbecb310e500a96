"""A task run's data and scoring: train batches, exact match against greedy decoding, a run end to end."""

import json
import random

import pytest
import torch

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.work import PAD, TaskBatches, score_instances
from posenc_bench.errors import ConfigError


def test_train_batches_are_fixed_by_the_seed_and_mask_the_answers_only():
    task = tasks.get("copy")
    a, b = TaskBatches(task, 2, 9, 16, seed=5), TaskBatches(task, 2, 9, 16, seed=5)
    for _ in range(3):
        (ta, ma), (tb, mb) = a.next(), b.next()
        assert torch.equal(ta, tb) and torch.equal(ma, mb)
    tokens, mask = TaskBatches(task, 2, 9, 64, seed=1).next()
    lengths = (tokens != PAD).sum(1)  # copy writes no PAD byte
    assert lengths.min() >= task.length(2) and lengths.max() <= task.length(9) and len(set(lengths.tolist())) > 3
    for row, n in zip(range(len(tokens)), lengths.tolist()):
        size = (n - 2) // 2
        assert mask[row].nonzero().flatten().tolist() == list(range(size + 1, 2 * size + 1))  # the targets of the answer
        assert (tokens[row, n:] == PAD).all()
    assert not torch.equal(TaskBatches(task, 2, 9, 16, seed=6).next()[0], TaskBatches(task, 2, 9, 16, seed=5).next()[0])


def greedy_correct(model, inst) -> bool:
    """Greedy decoding from the prompt: each answer place gets the model's argmax given what it generated so
    far; the given tokens between answer places (recall's keys) are appended as they are."""
    seq = inst.tokens[: inst.answer[0]]
    for i in range(inst.answer[0], len(inst.tokens)):
        if i in inst.answer:
            with torch.no_grad():
                logits = model(torch.tensor([seq]))
            seq.append(int(logits[0, -1].argmax()))
        else:
            seq.append(inst.tokens[i])
    return [seq[i] for i in inst.answer] == inst.answer_tokens()


@pytest.mark.parametrize("name", ["copy", "recall"])
def test_exact_match_in_one_forward_pass_is_greedy_decodings_success(name):
    """A briefly trained model gets some instances right and some wrong; the teacher-forced argmax scoring
    and greedy decoding agree on every one."""
    from posenc_bench.bench.config import TrainConfig
    from posenc_bench.bench.run.runtime import Runtime
    from posenc_bench.bench.train.loop import train
    from posenc_bench.model.transformer import DecoderLM, ModelConfig

    task = tasks.get(name)
    size = 6
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=2), "rope", task.length(size) - 1, seed=0)
    rt = Runtime.create("cpu", "fp32", show_progress=False)
    cfg = TrainConfig(train_len=task.length(size) - 1, batch_size=32, steps=250, lr=3e-3, warmup_steps=20, log_every=50)
    train(model, TaskBatches(task, 1, size, 32, seed=0), cfg, rt)
    model.eval()
    instances = [task.make(random.Random(100 + i), 1 + i % size) for i in range(40)]  # short ones come out right
    model.encoding.set_eval_length(task.length(size) - 1)
    result = score_instances(model, instances, rt, batch_size=16)
    greedy = [int(greedy_correct(model, inst)) for inst in instances]
    assert result["units"]["correct"] == greedy
    assert 0 < sum(greedy) < len(greedy)  # a mix, so the agreement is not trivial
    assert result["accuracy"] == sum(greedy) / len(greedy)
    assert 0 <= result["token_accuracy"] <= 1 and result["tokens"] == sum(len(i.answer) for i in instances)


def test_a_task_run_records_accuracy_per_instance_and_resumes(tmp_path, capsys):
    from posenc_bench.commands.cli import main

    args = ["run", "--config", "tasks-ci", "--encodings", "rope,alibi", "--steps", "30", "--set", "task.train_size=6",
            "--set", "task.eval_instances=24", "--out", str(tmp_path / "t"), "--progress", "off"]
    assert main(args) == 0
    assert "note: rope (seeds 0, 1), alibi (seeds 0, 1) did not learn the task" in capsys.readouterr().out  # per seed
    data = json.loads((tmp_path / "t" / "results.json").read_text())
    run, recs = data["run"], data["records"]
    assert run["train_len"] == 6 and run["eval_lengths"] == [6, 9, 12, 24] and run["config"]["train"]["train_len"] == 13
    assert run["corpus"]["source"] == "task:copy" and run["eval_instances"] == {"6": 24, "9": 24, "12": 24, "24": 24}
    for r in recs:
        assert r["metric"] == "accuracy" and r["ppl"] is None and len(r["units"]["correct"]) == 24
        assert r["accuracy"] == sum(r["units"]["correct"]) / 24
        assert r["token_accuracy"] == pytest.approx(sum(r["units"]["right"]) / sum(r["units"]["tokens"]))
        assert sum(r["units"]["tokens"]) == 24 * r["eval_len"]  # copy: one answer token per symbol
    table = (tmp_path / "t" / "table.md").read_text()
    assert table.startswith("Task copy (symbols 16)") and "Exact match" in table
    assert "did not learn the task" in table  # 30 steps learn nothing: flagged, as the plateau is for text
    capsys.readouterr()
    assert main(args) == 0 and "done before, skipped" in capsys.readouterr().out
    assert main(["eval", "--model", str(tmp_path / "t" / "checkpoints" / "rope-seed0"), "--out", str(tmp_path / "e")]) == 2
    assert "trained on the task 'copy'; `eval` scores text" in capsys.readouterr().err
    assert main([*args[:-4], "--set", "task.name=reverse", "--out", str(tmp_path / "t")]) == 2
    assert "different" in capsys.readouterr().err


def test_task_configs_refuse_fine_tuned_rows_and_sizes_past_the_task():
    from posenc_bench.bench.config import load_config

    with pytest.raises(ConfigError, match="-ft rows fine-tune on text"):
        load_config("tasks-ci", {"encodings": ["rope-ft"]})
    with pytest.raises(ConfigError, match="cannot be evaluated at size 160"):
        load_config("tasks-ci", {"task.name": "recall", "task.train_size": 40})
    cfg = load_config("tasks-ci", {"task.name": "recall", "task.train_size": 8})
    assert cfg.train.train_len == tasks.get("recall").length(8) - 1 and cfg.eval_lengths() == [8, 12, 16, 32]


def test_valid_instances_come_from_their_own_seed_and_the_test_ones_are_as_ever():
    from posenc_bench.bench.config import load_config
    from posenc_bench.bench.tasks.work import TaskWork, instance_seed, instances_fingerprint

    cfg = load_config("tasks-ci", {"task.eval_instances": 16})
    work = TaskWork(cfg)
    t = cfg.task
    for size in work.lengths:  # the test instances: the seed every committed run drew them from
        expected = work.task.eval_instances(random.Random(f"{t.name}|{size}|{t.eval_seed}"), size, 16)
        assert [i.tokens for i in work.instances[size]] == [i.tokens for i in expected]
    assert instance_seed("copy", 8, 0) == "copy|8|0" and instance_seed("copy", 8, 0, "valid") == "copy|8|0|valid"
    valid = work.valid()
    assert valid is work.valid() and {s: len(v) for s, v in valid.items()} == {s: 16 for s in work.lengths}
    for size in work.lengths:
        test_tokens = {tuple(i.tokens) for i in work.instances[size]}
        assert not test_tokens & {tuple(i.tokens) for i in valid[size]}, size  # no test instance is looked at
    assert work.eval_fingerprint == instances_fingerprint(work.instances) != work.valid_meta()["fingerprint"]
    assert work.valid_meta()["seed"] == "<task>|<size>|<eval_seed>|valid"
