"""The sweep's time estimate: its arithmetic (pure functions of seconds a step, steps, cells and eval cost),
never the clock (a fake clock drives :class:`Clock`); the time each config expects."""

import re
from dataclasses import replace

import pytest

from posenc_bench.bench.train import eta
from posenc_bench.bench.config import load_config
from posenc_bench.bench.rows import Row


def test_token_flops_counts_weights_and_causal_attention():
    cfg = load_config("default")
    m = cfg.model  # 128 wide, 4 layers, MLP x4, vocabulary 257
    weights = 4 * 12 * 128 * 128 + 128 * 257
    assert eta.token_flops(m, 128) == 2 * weights + 2 * 4 * 128 * 128
    assert eta.token_flops(m, 512) - eta.token_flops(m, 128) == 2 * 4 * (512 - 128) * 128


def test_cell_costs_train_each_model_once_and_price_eval_and_finetuning_by_flops():
    cfg = load_config("default", {"encodings": ["rope", "rope-linear", "rope-ft", "alibi"], "seeds": [0, 1]})
    costs = eta.cell_costs(cfg, cfg.cells())
    by = {(c.row, c.seed): c for c in costs}
    step = 3 * 32 * 128 * eta.token_flops(cfg.model, 128)
    evals = sum(65536 * eta.token_flops(cfg.model, L) for L in (128, 192, 256, 512)) / step
    assert by["rope", 0].train == 400 and by["rope-linear", 0].train == 0  # rope-linear evaluates rope's model
    assert by["alibi", 1].train == 400 and by["rope", 1].train == 400
    assert all(c.eval == pytest.approx(evals) for c in costs)
    p = cfg.finetune_plan()  # 40 steps of 8 x 512 tokens
    assert by["rope-ft", 0].finetune == pytest.approx(40 * 3 * 8 * 512 * eta.token_flops(cfg.model, 512) / step)
    assert by["rope-ft", 0].train == 0 and by["rope", 0].finetune == 0 and p.steps == 40
    # finished checkpoints are not trained again
    again = eta.cell_costs(cfg, cfg.cells(), finished={(Row("rope"), 0), (Row("rope-ft"), 0)})
    assert [c.train + c.finetune for c in again if c.seed == 0] == [0, 0, 0, 400]


def test_a_fine_tuned_row_alone_pays_for_its_trained_model():
    cfg = load_config("default", {"encodings": ["rope-ft"]})
    (cost,) = eta.cell_costs(cfg, cfg.cells())
    assert cost.train == 400 and cost.finetune > 0


def test_seconds_left_uses_the_measured_step_then_the_rate_of_finished_cells():
    costs = [eta.CellCost("a", 0, train=100), eta.CellCost("b", 0, train=100, eval=50), eta.CellCost("c", 0, eval=50)]
    assert eta.seconds_left(costs, 0, 2.0) == 2.0 * 300
    assert eta.seconds_left(costs, 1, 2.0) == 2.0 * 200  # nothing measured yet: the step time
    assert eta.seconds_left(costs, 1, 2.0, elapsed_s=300.0) == 3.0 * 200  # cell a took 3 s a step
    assert eta.seconds_left(costs, 3, 2.0, elapsed_s=900.0) == 0.0


@pytest.mark.parametrize("seconds,text", [(0.2, "1 s"), (45, "45 s"), (89, "89 s"), (600, "10 min"),
                                          (3600, "1 h"), (7500, "2 h 5 min"), (39420, "10 h 57 min"),
                                          (3 * 86400, "3.0 days")])
def test_duration(seconds, text):
    assert eta.duration(seconds) == text


_PROMISE = re.compile(r"\babout (\d+(?:\.\d+)?) ?(s|sec|seconds?|min|minutes?|h|hours?)\b")
_UNIT_S = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60, "h": 3600,
           "hour": 3600, "hours": 3600}


def stated_seconds(header: str):
    """The time a config's header comment promises ("... in about 10 minutes on 2 CPU cores"), or None."""
    found = _PROMISE.search(header)
    return float(found.group(1)) * _UNIT_S[found.group(2)] if found else None


def test_the_stated_time_reads_a_comment_in_words():
    assert stated_seconds("Sized so that ... the whole sweep finishes in about 10 minutes on 2 CPU cores") == 600
    assert stated_seconds("every encoding, three seeds, in about 80 s on 2 CPU cores (about 27 s a seed)") == 80
    assert stated_seconds("for a GPU (bf16 autocast)") is None


def test_each_configs_expected_time_is_the_one_its_comment_states():
    """The estimate reads ``expected_sweep_s``; every built-in config's header says the same time in words (or
    none), so `posenc-bench configs` and the run's note quote the comment truly."""
    from posenc_bench.bench.config import builtin_configs, config_header

    expected = {name: load_config(name).expected_sweep_s for name in builtin_configs()}
    assert expected == {name: stated_seconds(config_header(path)) for name, path in builtin_configs().items()}
    assert expected["default"] == 600 and expected["ci"] == 80 and expected["long-2048"] is None


def test_a_note_only_past_three_times_the_stated_time_or_an_hour_on_a_cpu():
    assert eta.note_after(600, "cpu") == 1800 and eta.note_after(None, "cpu") == 3600
    assert eta.note_after(7200, "cpu") == 3600 and eta.note_after(600, "cuda") == 1800
    assert eta.note_after(None, "cuda") is None
    assert eta.warning(1500, 600, "cpu", []) is None  # 2.5x: not "far"
    far = eta.warning(39420, 600, "cuda", ["--batch-size 2"])
    assert far == ("  note: about 10 h 57 min, far beyond the ~10 min the config's comment states; under 30 min here "
                   "with any one of: --batch-size 2 (or a GPU, --device cuda)")
    assert eta.warning(4000, None, "cpu", ["--train-len 64"]).startswith("  note: about 1 h 7 min on this CPU; under 1 h")
    assert eta.warning(4000, None, "cuda", []) is None and eta.warning(3000, None, "cpu", []) is None
    assert eta.warning(4000, None, "cpu", []).endswith("brings it under 1 h here: it needs a GPU (--device cuda)")


def _mission(step_s: float):
    """`run --train-len 2048 --eval-lens 4096`: the default config's 7 rows (6 trained models)."""
    cfg = load_config("default", {"train.train_len": 2048, "eval.lens": ["4096"]})
    return cfg, eta.cell_costs(cfg, cfg.cells()), eta.estimate_lines


def test_the_mission_command_is_priced_at_about_half_a_day_on_a_16_s_step():
    """On 2 CPU cores (16.4 s a step measured here): 6 trained models of 400 steps, 7 cells evaluated."""
    cfg, costs, _ = _mission(16.4)
    assert sum(c.train for c in costs) == 6 * 400
    lines = eta.estimate_lines(cfg, costs, 16.4, "cpu")  # the default config expects 600 s
    assert lines[0].startswith("  timing: 16.4 s a training step on cpu: about 1 h 49 min a model (400 steps)")
    assert "for the sweep (7 cells)" in lines[0] and "far beyond the ~10 min" in lines[1]


@pytest.mark.parametrize("device,stated", [("cpu", 600), ("cpu", None), ("cuda", 600)])
def test_every_option_the_note_names_brings_the_sweep_under_its_limit(device, stated):
    """Each flag the note suggests, applied alone, prices the sweep under the limit, so a rerun with it gets no
    note (the hint never repeats itself); the step time scales with the step's FLOPs."""
    cfg, costs, _ = _mission(16.4)
    limit = eta.note_after(stated, device)
    options = eta.quicker(cfg, costs, 16.4, limit)
    assert options and any(o.startswith("--batch-size") for o in options)
    flags = {"--batch-size": "train.batch_size", "--train-len": "train.train_len", "--encodings": "encodings"}
    for option in options:
        flag, value = option.split(" ")
        other = load_config("default", {"train.train_len": 2048, "eval.lens": ["4096"],
                                        flags[flag]: value.split(",") if flag == "--encodings" else int(value)})
        step_s = 16.4 * eta.step_flops(other) / eta.step_flops(cfg)
        total = eta.seconds_left(eta.cell_costs(other, other.cells()), 0, step_s)
        assert total <= limit, option
        assert eta.warning(total, stated, device, []) is None


def test_when_nothing_fits_the_note_says_a_gpu_is_needed():
    cfg, costs, _ = _mission(16.4)
    assert eta.quicker(cfg, costs, 5000.0, 3600) == []  # even one row at batch 1 takes hours
    lines = eta.estimate_lines(replace(cfg, expected_sweep_s=None), costs, 5000.0, "cpu")
    assert lines[1].endswith("it needs a GPU (--device cuda)")


def test_clock_prints_the_estimate_once_after_the_first_steps_and_the_time_left_after_cells():
    now = [0.0]
    lines = []
    costs = [eta.CellCost("a", 0, train=10), eta.CellCost("b", 0, train=10), eta.CellCost("c", 0, eval=5)]
    clock = eta.Clock(load_config("default", {"train.steps": 10, "expected_sweep_s": None}), costs, "cpu", lines.append,
                      now=lambda: now[0])
    for t in (5.0, 6.0, 7.0):  # the first step warms up (5 s); then 1 s a step
        now[0] = t
        clock.step()
    assert lines == []
    now[0] = 8.0
    clock.step()
    assert clock.sec_per_step == 1.0 and len(lines) == 1 and "about 25 s for the sweep (3 cells)" in lines[0]
    for _ in range(20):
        clock.step()
    assert len(lines) == 1
    now[0] = 20.0  # cell a: 10 steps in 20 s
    clock.cell_done()
    assert lines[-1] == "  cell 1/3, about 30 s left"
    clock.cell_done()
    clock.cell_done()
    assert len(lines) == 3  # nothing after the last cell


def test_a_resumed_sweeps_clock_counts_the_cells_finished_before():
    """2 of 6 cells done by an earlier run: the next finished cell is "cell 3/6", not "cell 1/4"."""
    now = [0.0]
    lines = []
    costs = [eta.CellCost(row, 0, train=10) for row in "abcd"]
    clock = eta.Clock(load_config("default", {"train.steps": 10, "expected_sweep_s": None}), costs, "cpu", lines.append,
                      now=lambda: now[0], before=2)
    now[0] = 10.0
    clock.cell_done()
    clock.cell_done()
    assert lines == ["  cell 3/6, about 30 s left", "  cell 4/6, about 10 s left"]


def test_clock_stops_measuring_after_measure_s_of_slow_steps():
    now = [0.0]
    lines = []
    clock = eta.Clock(load_config("default"), [eta.CellCost("a", 0, train=400)], "cpu", lines.append,
                      now=lambda: now[0])  # the default config expects 600 s
    for t in (19.0, 36.0, 53.0):  # after two timed steps: 34 s >= MEASURE_S
        now[0] = t
        clock.step()
    assert clock.sec_per_step == 17.0 and "far beyond" in lines[1]


def test_a_shorter_train_length_in_the_note_is_named_a_different_experiment_and_plans_silence_the_note():
    assert eta.warning(4000, None, "cuda", ["--train-len 64"]) is None
    said = eta.warning(4000, None, "cpu", ["--batch-size 2", "--train-len 64"], train_len=2048)
    assert said.endswith("--batch-size 2; --train-len 64 (a different experiment: extrapolation from 64, not 2048) "
                         "(or a GPU, --device cuda)")
    cfg, costs, _ = _mission(25.0)
    assert len(eta.estimate_lines(cfg, costs, 25.0, "cpu")) == 2
    assert len(eta.estimate_lines(cfg, costs, 25.0, "cpu", note=False)) == 1  # the plans said it before training
