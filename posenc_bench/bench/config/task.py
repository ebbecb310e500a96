"""The ``task`` section: a run on one of the task track's tasks (``bench/tasks``) instead of text."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TaskConfig:
    """The task track (``bench/tasks``, docs/tasks.md): with a ``name`` the run trains on that task instead of
    text; ``train.train_len`` is then the longest train instance's input length, and eval lengths are multiples
    of ``train_size`` (instance sizes, not tokens)."""

    name: str = ""  # "" (text) | copy | reverse | addition | recall | needle
    options: dict = field(default_factory=dict)  # the task's own, e.g. {index_hints: true} for addition
    train_size: int = 16  # train instances have sizes drawn uniformly from min_size .. train_size
    min_size: int = 1
    eval_instances: int = 256  # test instances per eval size, the same for every row
    eval_seed: int = 0  # seeds the test instances (train instances come from the training seed)
