"""needle: the value sits at its depth; evaluation spreads instances over the depths."""

import random

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.needle import MARK, QUERY


def test_the_needle_sits_at_its_depth_and_eval_instances_cover_every_depth():
    needle = tasks.get("needle", {"digits": 3})
    for depth, at in [(0.0, 1), (0.5, 1 + 10), (1.0, 1 + 20)]:
        inst = needle.make(random.Random(1), 20, depth)
        assert inst.tokens[at] == MARK and inst.tokens[-5] == QUERY and inst.meta == {"depth": depth}
        assert inst.answer_tokens() == inst.tokens[at + 2 : at + 5]
    spread = needle.eval_instances(random.Random(0), 20, 10)
    assert [i.meta["depth"] for i in spread] == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0]
