"""What a task is: a seeded generator of instances, a reference solver in plain Python, and the token format.

An instance is one sequence of byte tokens (BOS = 256 first) and the places in it that are scored: the answer
tokens. A model reads the whole sequence and is trained, and scored, on the answer tokens only, each given the
correct tokens before it (teacher forcing). An instance is answered correctly when every answer token is the
model's argmax there: with the correct prefix given, that is exactly when greedy decoding would produce the
whole answer, so one forward pass scores a batch (``tests/bench/tasks/test_work.py`` checks the two agree).

An instance's *size* is the task's own measure (symbols to copy, digits to add, key-value pairs, filler
tokens); the run trains on sizes drawn uniformly from 1 to the train size and evaluates at multiples of it.
A task is one file: a :class:`Task` subclass with ``make`` (the instance of a size from a random stream) and
``solve`` (its answer from the prompt alone, the reference that ``make``'s answers are checked against), and
``register``-ed by name in ``tasks/__init__.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

BOS = 256
SEP = ord("=")
LETTERS = [ord(c) for c in "abcdefghijklmnop"]  # the 16 symbols of copy and reverse
DIGITS = [ord(c) for c in "0123456789"]


@dataclass
class Instance:
    """One sequence and its answer places. ``tokens`` holds BOS, the prompt and the answer; ``answer`` the
    indices of ``tokens`` that are scored (each predicted from the tokens before it)."""

    tokens: list[int]
    answer: list[int]
    meta: dict = field(default_factory=dict)  # e.g. the needle's depth

    def answer_tokens(self) -> list[int]:
        return [self.tokens[i] for i in self.answer]


class Task:
    """A task of one name with its options (given as keyword arguments, each a documented default)."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""  # whose setup it follows

    def make(self, rng: random.Random, size: int) -> Instance:
        raise NotImplementedError

    def solve(self, inst: Instance) -> list[int]:
        """The answer tokens computed from the prompt (the tokens before the first answer place and, for
        interleaved formats, the given tokens between answers) by plain Python."""
        raise NotImplementedError

    def eval_instances(self, rng: random.Random, size: int, count: int) -> list[Instance]:
        """The test instances of one size: ``count`` draws of ``make`` (a task with a grid of its own, the
        needle's depths, overrides it)."""
        return [self.make(rng, size) for _ in range(count)]

    def length(self, size: int) -> int:
        """Tokens of an instance of ``size`` (every instance of a size has this length)."""
        return len(self.make(random.Random(0), size).tokens)

    def options(self) -> dict:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def prompt_answer(prompt: list[int], answer: list[int]) -> Instance:
    """BOS, ``prompt``, then ``answer`` scored."""
    tokens = [BOS, *prompt, *answer]
    return Instance(tokens, list(range(1 + len(prompt), len(tokens))))
