"""needle: one key-value pair hidden at a chosen depth of random filler; the key again at the end, its value
to be written.

The synthetic needle-in-a-haystack test (Kamradt 2023; the passkey retrieval of Mohtashami & Jaggi 2023) made a
task a model is trained on: filler of ``size`` random letters (a-z), the needle ``#``, a key token (128-255)
and a value of ``digits`` digits at depth d (0: first, 1: last) of the filler, then ``?``, the key and the value
(its digits scored). Training draws the depth uniformly; evaluation puts the same number of instances at each
depth of ``depths``, so a table of depth x length shows where retrieval fails, and the effective length is
the largest length at which every depth is answered at least as often as a threshold.
"""

from __future__ import annotations

import random
from typing import Optional

from posenc_bench.bench.tasks.base import BOS, DIGITS, Instance, Task

MARK, QUERY = ord("#"), ord("?")
FILLER = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz"]
KEYS = list(range(128, 256))
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


class Needle(Task):
    name = "needle"
    paper = "Mohtashami & Jaggi 2023 (passkey), Kamradt 2023 (needle in a haystack)"

    def __init__(self, digits: int = 4, depths: tuple = DEPTHS) -> None:
        if digits < 1 or not depths or any(not 0 <= d <= 1 for d in depths):
            raise ValueError(f"needle takes digits >= 1 and depths in [0, 1], got {digits} and {list(depths)}")
        self.digits, self.depths = digits, tuple(float(d) for d in depths)

    def make(self, rng: random.Random, size: int, depth: Optional[float] = None) -> Instance:
        depth = rng.random() if depth is None else depth
        filler = [rng.choice(FILLER) for _ in range(size)]
        key, value = rng.choice(KEYS), [rng.choice(DIGITS) for _ in range(self.digits)]
        at = round(depth * size)
        tokens = [BOS, *filler[:at], MARK, key, *value, *filler[at:], QUERY, key, *value]
        return Instance(tokens, list(range(len(tokens) - self.digits, len(tokens))), {"depth": depth})

    def eval_instances(self, rng: random.Random, size: int, count: int) -> list[Instance]:
        """``count`` instances spread evenly over ``depths`` (at least one at each)."""
        per = max(1, count // len(self.depths))
        return [self.make(rng, size, d) for d in self.depths for _ in range(per)]

    def solve(self, inst: Instance) -> list[int]:
        key = inst.tokens[inst.answer[0] - 1]
        at = next(i for i, t in enumerate(inst.tokens) if t == MARK and inst.tokens[i + 1] == key)
        return inst.tokens[at + 2 : at + 2 + self.digits]
