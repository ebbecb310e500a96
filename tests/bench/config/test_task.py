"""The task section (bench/config/task.py): the task track's built-in configs, and what a task run derives."""

from pathlib import Path

from posenc_bench.bench.config import TaskConfig, load_config


def test_a_task_runs_train_length_follows_its_task_and_text_runs_have_none():
    from posenc_bench.bench import tasks

    assert load_config("default").task == TaskConfig() and not TaskConfig().name
    cfg = load_config("tasks-ci", {"train.train_len": 5})  # the task decides it, whatever the file says
    assert cfg.task.name == "copy" and cfg.train.train_len == tasks.input_length(cfg.task) > 5


def test_every_task_config_loads_and_its_window_control_keeps_a_cache_of_its_train_length():
    """The task track's configs: each task's window rows (W + 4 sinks) hold its derived train length, so the
    window-only control and the sinks row see every token at 1x and lose the oldest beyond it."""
    names = sorted(p.stem for p in Path("configs").glob("tasks-*.yaml"))
    assert {"tasks-ci", "tasks-copy", "tasks-reverse", "tasks-needle", "tasks-recall", "tasks-addition",
            "tasks-addition-hints"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.eval_lengths()[0] == cfg.task.train_size and cfg.eval_lengths()[-1] == 4 * cfg.task.train_size
        windows = [e for e in cfg.encodings if "+sw" in e]
        assert all(e.endswith(f"+sw{cfg.train.train_len - 4}") for e in windows), (name, windows)
        assert cfg.out == f"results/tasks/{name.removeprefix('tasks-')}" or name == "tasks-ci"
        assert "rope" in cfg.encodings and (name == "tasks-ci" or (cfg.task.name == "addition") == (not windows))
