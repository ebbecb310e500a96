"""The cheaper plans a CPU run prints before its first training step: each a real command line (parsed by the
CLI's parser, its config built by the loader and priced again), cheaper than the sweep, with what it changes;
a fake measured step time keeps them fast and deterministic."""

import shlex

import pytest

from posenc_bench.bench.config import load_config
from posenc_bench.bench.train import eta, plans
from posenc_bench.commands.cli import build_parser
from posenc_bench.commands.run import run_config

MISSION = ["--train-len", "2048", "--eval-lens", "4096", "--out", "/tmp/mission"]
STEP_S = 25.0  # seconds a training step of the mission on 2 CPU cores


def _mission():
    cfg = load_config("default", {"train.train_len": 2048, "eval.lens": ["4096"], "out": "/tmp/mission"})
    return cfg, eta.cell_costs(cfg, cfg.cells())


def _commands(lines):
    return [line.split(": ", 1)[1] for line in lines if line.startswith("    about ")]


def test_the_mission_prints_the_sweep_one_row_the_plans_and_the_gpu_config():
    cfg, costs = _mission()
    lines = plans.plan_lines(cfg, costs, STEP_S, "cpu", MISSION)
    assert lines[0] == ("  plan: 25 s a training step on this CPU (timed before training): about 16 h 42 min for the "
                        "sweep (7 cells), far beyond the ~10 min the config states")
    assert lines[1] == ("  one row (a model of 400 steps and its evaluations): about 2 h 47 min a seed, 2 h 47 min for "
                        "its 1 seed(s)")
    assert lines[2].startswith("  cheaper plans that keep train length 2048, one change each")
    text = "\n".join(lines)
    for flag in ("--encodings rope,alibi", "--steps ", "--batch-size ", "--d-model 64 --n-layers 2"):
        assert flag in text, flag
    assert "the comparison narrows to rope and alibi" in text and "less capacity" in text
    assert "under the ~3M that models needed to leave the no-position plateau" in text  # 11 steps of 32 x 2048
    assert lines[-2].startswith("  on a machine with a GPU: posenc-bench run --config long-2048 (7 rows, train "
                                "length 2048, eval to 8192")
    assert lines[-1].endswith("is a different experiment: it measures extrapolation from 64, not 2048")
    assert "--seeds" not in text  # one seed already


def test_every_plan_is_a_real_command_line_whose_own_estimate_is_the_printed_one_and_smaller():
    cfg, costs = _mission()
    total = eta.seconds_left(costs, 0, STEP_S)
    lines = plans.plan_lines(cfg, costs, STEP_S, "cpu", MISSION)
    estimates = [line.split(": ", 1)[0].strip() for line in lines if line.startswith("    about ")]
    commands = _commands(lines)
    assert len(commands) == 4
    for shown, line in zip(estimates, commands):
        argv = shlex.split(line)
        assert argv[:2] == ["posenc-bench", "run"] and argv[2:6] == MISSION[:4], line
        other = run_config(build_parser().parse_args(argv[1:]))
        assert other.train.train_len == 2048, line
        seconds = eta.seconds_left(eta.cell_costs(other, other.cells()),
                                   0, STEP_S * eta.step_flops(other) / eta.step_flops(cfg))
        assert shown == f"about {eta.duration(seconds)}" and seconds < total / 3, line
        if "--encodings" not in line:  # a plan that changes what is measured writes to its own folder
            assert other.out.startswith("/tmp/mission-"), line


def test_several_seeds_get_a_one_seed_plan_and_rows_without_rope_keep_the_first_two():
    cfg = load_config("default", {"train.train_len": 2048, "eval.lens": ["4096"], "seeds": [0, 1, 2],
                                  "encodings": ["sinusoidal", "learned", "t5"]})
    lines = plans.plan_lines(cfg, eta.cell_costs(cfg, cfg.cells()), STEP_S, "cpu", ["--seeds", "3"])
    text = "\n".join(lines)
    assert "for its 3 seed(s)" in lines[1] and "8 h 21 min for its 3 seed(s)" in lines[1]
    assert "posenc-bench run --seeds 1\n" in text + "\n" and "no seed-level interval" in text
    assert "--encodings sinusoidal,learned" in text


def test_no_plans_within_the_configs_time_or_on_a_gpu():
    cfg, costs = _mission()
    assert plans.plan_lines(cfg, costs, 0.05, "cpu", MISSION) == []  # 2.4 min: within 3 x 10 min
    assert plans.plan_lines(cfg, costs, STEP_S, "cuda", MISSION) == []
    default = load_config("default")
    assert plans.plan_lines(default, eta.cell_costs(default, default.cells()), 0.2, "cpu", []) == []


@pytest.mark.parametrize("base,flags,line", [
    ([], {"--steps": 5}, "posenc-bench run --steps 5"),
    (["--steps", "400", "--fresh"], {"--steps": 5}, "posenc-bench run --fresh --steps 5"),
    (["--encodings=rope,t5"], {"--encodings": "rope"}, "posenc-bench run --encodings rope"),
    (["--set", "train.lr=1e-3"], {"--seeds": 1}, "posenc-bench run --set train.lr=1e-3 --seeds 1"),
])
def test_command_replaces_a_flag_given_before(base, flags, line):
    assert plans.command(base, flags) == line


def test_plan_flags_put_an_identity_changing_plan_next_to_the_given_folder():
    plan = plans.Plan({"--steps": 5}, {"train.steps": 5}, "", "steps5")
    assert plans.plan_flags(["--out", "/tmp/m/"], plan) == {"--steps": 5, "--out": "/tmp/m-steps5"}
    assert plans.plan_flags(["--out=/tmp/m"], plan)["--out"] == "/tmp/m-steps5"
    assert plans.plan_flags([], plan) == {"--steps": 5}  # the run's default folder: left to the run
    assert plans.plan_flags(["--out", "/tmp/m"], plans.Plan({"--seeds": 1}, {}, "")) == {"--seeds": 1}


def test_plateau_warning_counts_training_tokens():
    assert plans.plateau_warning(load_config("default", {"train.train_len": 2048})) is None  # 26M tokens
    assert plans.plateau_warning(load_config("default", {"train.train_len": 2048, "train.steps": 40})).startswith(
        "warning: 2.6M training tokens a model")
