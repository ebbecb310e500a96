"""addition: reversed arithmetic, index hints."""

import random

import pytest

from posenc_bench.bench import tasks
from posenc_bench.bench.tasks.addition import HINTS, PLUS
from posenc_bench.bench.tasks.base import DIGITS, SEP
from posenc_bench.errors import ConfigError


@pytest.mark.parametrize("hints", [False, True])
def test_addition_is_reversed_arithmetic_with_consistent_index_hints(hints):
    task = tasks.get("addition", {"index_hints": hints})
    for seed in range(20):
        size = 1 + seed
        inst = task.make(random.Random(seed), size)
        text = inst.tokens[1:]
        plus, eq = text.index(PLUS), text.index(SEP)
        digits = lambda part: [t - DIGITS[0] for t in part if t in DIGITS]  # noqa: E731
        a, b, c = digits(text[:plus]), digits(text[plus:eq]), [t - DIGITS[0] for t in inst.answer_tokens()]
        value = lambda ds: sum(d * 10**i for i, d in enumerate(ds))  # noqa: E731 - least significant first
        assert len(a) == len(b) == size and len(c) == size + 1 and value(a) + value(b) == value(c)
        if hints:  # the same marker before a place's digit in both operands and the answer, consecutive
            marks = [[t for t in part if t in HINTS] for part in (text[:plus], text[plus:eq], text[eq:])]
            assert marks[0] == marks[1] == marks[2][:size] and len(marks[2]) == size + 1
            assert marks[2] == list(range(marks[2][0], marks[2][0] + size + 1))
            assert all(inst.tokens[i - 1] in HINTS for i in inst.answer)  # hints are given, digits scored
    with pytest.raises(ConfigError, match="cannot be evaluated at size 256"):
        tasks.validate(type("T", (), {"name": "addition", "options": {"index_hints": True}})(), [16, 256])
