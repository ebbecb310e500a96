"""What a task is: every instance answered by its reference solver, one length per size, the registry."""

import random

import pytest

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.base import BOS
from posenc_bench.errors import ConfigError

ALL = [("copy", {}), ("reverse", {}), ("addition", {}), ("addition", {"index_hints": True}), ("recall", {}),
       ("needle", {})]


@pytest.mark.parametrize("name,options", ALL)
def test_every_instance_is_answered_by_the_reference_solver(name, options):
    task = tasks.get(name, options)
    rng = random.Random(7)
    for size in [1, 2, 3, 8, 17, 40]:
        for _ in range(5):
            inst = task.make(rng, size)
            assert inst.tokens[0] == BOS and all(0 <= t < 256 for t in inst.tokens[1:])
            assert inst.answer and inst.answer == sorted(inst.answer) and inst.answer[-1] == len(inst.tokens) - 1
            assert task.solve(inst) == inst.answer_tokens()
            assert len(inst.tokens) == task.length(size)  # every instance of a size has one length


def test_unknown_tasks_and_options_name_the_valid_ones():
    with pytest.raises(ConfigError, match="valid tasks: copy, reverse, addition, recall, needle"):
        tasks.get("sort")
    with pytest.raises(ConfigError, match="task 'copy' has no option 'hints'; valid options: symbols"):
        tasks.get("copy", {"hints": True})
    with pytest.raises(ConfigError, match="symbols must be 2..16"):
        tasks.get("copy", {"symbols": 40})
