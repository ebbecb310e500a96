"""recall: multi-query associative recall (MQAR). Key-value pairs, then every key again, each to be answered
with its value.

Arora et al. 2023 ("Zoology: Measuring and Improving Recall in Efficient Language Models", sec. 3.1): keys and
values from disjoint vocabularies, pairs first, queries after in random order, each query's value scored. It
is the retrieval task where attention restricted to a window must fail: a query whose pair lies further back
than the window cannot be answered. Here: ``size`` pairs of one key token (the byte tokens 128-255, distinct
within an instance: sizes up to 128) and one value token (0-9 a-z), ``=`` after the pairs, then every key
once in random order with its value after it (scored).
"""

from __future__ import annotations

import random

from posenc_bench.bench.tasks.base import BOS, SEP, Instance, Task

KEYS = list(range(128, 256))
VALUES = [ord(c) for c in "0123456789abcdefghijklmnopqrstuvwxyz"]


class Recall(Task):
    name = "recall"
    paper = "Arora et al. 2023 (Zoology's MQAR)"

    def make(self, rng: random.Random, size: int) -> Instance:
        if size > len(KEYS):
            raise ValueError(f"recall has {len(KEYS)} distinct keys: size {size} is too many pairs")
        keys = rng.sample(KEYS, size)
        values = [rng.choice(VALUES) for _ in keys]
        tokens = [BOS] + [t for kv in zip(keys, values) for t in kv] + [SEP]
        answer = []
        for i in rng.sample(range(size), size):
            tokens.append(keys[i])
            answer.append(len(tokens))
            tokens.append(values[i])
        return Instance(tokens, answer)

    def solve(self, inst: Instance) -> list[int]:
        sep = inst.tokens.index(SEP)
        table = dict(zip(inst.tokens[1:sep:2], inst.tokens[2:sep:2]))
        return [table[inst.tokens[i - 1]] for i in inst.answer]
