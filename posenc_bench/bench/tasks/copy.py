"""copy and reverse: repeat a string of random symbols after a separator, as it is or reversed.

Ruoss et al. 2023 ("Randomized Positional Encodings Boost Length Generalization of Transformers", sec. 4 and
app. B: duplicate_string and reverse_string) train on strings of length 1-40 and test on 41-500; McGill's copy
and reverse tasks likewise. Here: 16 symbols (a-p), ``=`` between string and answer, a causal decoder that
reads the string and writes the answer, every answer symbol scored. The answer's i-th symbol sits exactly
``size + 1`` places after the symbol it repeats (copy), or mirrors it around the separator (reverse): both
ask for attention by position, not by content.
"""

from __future__ import annotations

import random

from posenc_bench.bench.tasks.base import LETTERS, SEP, Instance, Task, prompt_answer


class Copy(Task):
    name = "copy"
    paper = "Ruoss et al. 2023 (duplicate_string)"

    def __init__(self, symbols: int = 16) -> None:
        if not 2 <= symbols <= len(LETTERS):
            raise ValueError(f"symbols must be 2..{len(LETTERS)}, got {symbols}")
        self.symbols = symbols

    def _answer(self, string: list[int]) -> list[int]:
        return list(string)

    def make(self, rng: random.Random, size: int) -> Instance:
        string = [rng.choice(LETTERS[: self.symbols]) for _ in range(size)]
        return prompt_answer(string + [SEP], self._answer(string))

    def solve(self, inst: Instance) -> list[int]:
        prompt = inst.tokens[1 : inst.answer[0]]  # the string, then SEP
        if prompt[-1] != SEP:
            raise ValueError("not a copy/reverse prompt: no separator before the answer")
        return self._answer(prompt[:-1])


class Reverse(Copy):
    name = "reverse"
    paper = "Ruoss et al. 2023 (reverse_string)"

    def _answer(self, string: list[int]) -> list[int]:
        return string[::-1]
