"""addition: two numbers of ``size`` digits, written least significant digit first, and their sum.

Zhou et al. 2024 ("Transformers Can Achieve Length Generalization But Not Robustly"): reversed operands and
answer, so each answer digit depends on the digits at its own place and the carry, and optional *index hints*,
a marker before every digit that names its place (the same marker before a place's digit in both operands and
the answer; the markers are consecutive from a random start, as the paper samples them, so places past the
train size use markers seen in training). Their models train on up to 40 digits and reach 100 digits with
FIRE and index hints; McLeish et al. 2024 (Abacus) is the same task with a learned per-digit embedding.
Here: both operands have ``size`` digits (leading zeros allowed), the sum has ``size + 1``, ``+`` and ``=``
between them, the hints are the byte tokens 128-255 and are given in the answer (only its digits are scored).
"""

from __future__ import annotations

import random

from posenc_bench.bench.tasks.base import BOS, DIGITS, SEP, Instance, Task

PLUS = ord("+")
HINTS = list(range(128, 256))  # 128 place markers: sizes up to 127 digits


def add_reversed(a: list[int], b: list[int]) -> list[int]:
    """Digits (least significant first) of a + b, one more digit than the operands."""
    out, carry = [], 0
    for x, y in zip(a, b):
        carry, digit = divmod(x + y + carry, 10)
        out.append(digit)
    return out + [carry]


class Addition(Task):
    name = "addition"
    paper = "Zhou et al. 2024 (reversed format, index hints)"

    def __init__(self, index_hints: bool = False) -> None:
        self.index_hints = bool(index_hints)

    def make(self, rng: random.Random, size: int) -> Instance:
        if self.index_hints and size + 1 > len(HINTS):
            raise ValueError(f"addition with index hints has {len(HINTS)} place markers: size {size} needs {size + 1}")
        a, b = ([rng.randrange(10) for _ in range(size)] for _ in range(2))
        start = rng.randrange(len(HINTS) - size) if self.index_hints else 0
        hints = HINTS[start : start + size + 1]
        tokens, answer = [BOS], []

        def put(digits: list[int], scored: bool) -> None:
            for place, d in enumerate(digits):
                if self.index_hints:
                    tokens.append(hints[place])
                if scored:
                    answer.append(len(tokens))
                tokens.append(DIGITS[d])

        put(a, False)
        tokens.append(PLUS)
        put(b, False)
        tokens.append(SEP)
        put(add_reversed(a, b), True)
        return Instance(tokens, answer)

    def solve(self, inst: Instance) -> list[int]:
        prompt = inst.tokens[: inst.tokens.index(SEP)]
        plus = prompt.index(PLUS)
        a, b = ([t - DIGITS[0] for t in part if t in DIGITS] for part in (prompt[:plus], prompt[plus:]))
        return [DIGITS[d] for d in add_reversed(a, b)]
