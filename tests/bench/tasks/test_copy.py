"""copy and reverse: their formats."""

import random

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.base import SEP


def test_copy_and_reverse_formats():
    inst = tasks.get("copy").make(random.Random(0), 5)
    string = inst.tokens[1:6]
    assert inst.tokens[6] == SEP and inst.answer_tokens() == string and inst.answer == [7, 8, 9, 10, 11]
    rev = tasks.get("reverse").make(random.Random(0), 5)
    assert rev.answer_tokens() == rev.tokens[1:6][::-1]
    assert all(t in b"abcd" for t in tasks.get("copy", {"symbols": 4}).make(random.Random(1), 50).tokens[1:51])
