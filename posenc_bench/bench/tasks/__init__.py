"""The task track: algorithmic tasks that test whether an encoding uses long context (``docs/tasks.md``).

``get(name, options)`` builds a task by name; ``TASKS`` lists them. Adding a task is one file (a ``Task``
subclass: ``make``, ``solve``) and its line here, and its test in ``tests/bench/tasks/test_<name>.py`` (the
solver test of ``tests/bench/tasks/test_base.py`` covers it by name).
"""

from __future__ import annotations

import inspect

from posenc_bench.bench.tasks.addition import Addition
from posenc_bench.bench.tasks.base import BOS, Instance, Task
from posenc_bench.bench.tasks.copy import Copy, Reverse
from posenc_bench.bench.tasks.needle import Needle
from posenc_bench.bench.tasks.recall import Recall
from posenc_bench.errors import ConfigError

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (Copy, Reverse, Addition, Recall, Needle)}

__all__ = ["BOS", "Instance", "TASKS", "Task", "get", "input_length", "validate", "window_length"]


def get(name: str, options: dict | None = None) -> Task:
    """The task ``name`` with ``options``; ConfigError naming the valid tasks or options."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    cls = TASKS[name]
    valid = list(inspect.signature(cls).parameters)
    unknown = [k for k in (options or {}) if k not in valid]
    if unknown:
        raise ConfigError(f"task {name!r} has no option {unknown[0]!r}; valid options: {', '.join(valid) or '(none)'}")
    try:
        return cls(**(options or {}))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task {name!r}: {e}") from None


def validate(cfg, sizes: list[int]) -> None:
    """ConfigError for a bad ``task`` section (a ``config.TaskConfig``) or an eval size past the task's largest."""
    task = get(cfg.name, cfg.options)
    for size in sizes:
        try:
            task.length(size)
        except ValueError as e:
            raise ConfigError(f"task {cfg.name!r} cannot be evaluated at size {size}: {e}") from None
    if not 1 <= cfg.min_size <= cfg.train_size or cfg.eval_instances < 1:
        raise ConfigError(f"task.min_size must be 1..task.train_size ({cfg.train_size}) and task.eval_instances >= 1, "
                          f"got {cfg.min_size} and {cfg.eval_instances}")
    input_length(cfg)  # raises past the task's largest size

def input_length(cfg) -> int:
    """The model's train length for a task run: the tokens it reads of the longest train instance (all but the
    last), so every train instance fits and an encoding's train length means what it means on text."""
    return window_length(cfg, cfg.train_size, "train_size")


def window_length(cfg, size: int, key: str = "size") -> int:
    """The tokens the model reads of an instance of ``size`` (all but the last): its window at that size."""
    task = get(cfg.name, cfg.options)
    try:
        return task.length(size) - 1
    except ValueError as e:
        raise ConfigError(f"task {cfg.name!r} at {key} {size}: {e}") from None
