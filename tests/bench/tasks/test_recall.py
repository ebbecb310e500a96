"""recall (MQAR): every key queried once."""

import random

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.base import SEP


def test_recall_queries_every_key_once_with_its_value():
    inst = tasks.get("recall").make(random.Random(3), 12)
    sep = inst.tokens.index(SEP)
    keys, values = inst.tokens[1:sep:2], inst.tokens[2:sep:2]
    assert len(set(keys)) == 12 and sorted(inst.tokens[i - 1] for i in inst.answer) == sorted(keys)
    table = dict(zip(keys, values))
    assert all(inst.tokens[i] == table[inst.tokens[i - 1]] for i in inst.answer)
