"""The multi-needle haystack: sentences of natural text, never repeated; needles drawn again while in the text."""

import random

import pytest

from posenc_bench.bench.eval.haystack import HaystackText, draw, new_key, new_value
from posenc_bench.errors import ConfigError


class Bytes:
    def encode(self, text):
        return list(text.encode())


def test_documents_become_sentences_with_their_leading_space():
    text = HaystackText.from_documents([("a", b"First one.  Second\none!\n"), ("b", b"Third? Fourth")], {"split": "x"})
    assert text.sentences == [" First one.", " Second one!", " Third?", " Fourth"]
    with pytest.raises(ConfigError, match="no sentences"):
        HaystackText.from_documents([("a", b"  \n")])


def test_a_haystack_takes_whole_sentences_from_its_start_and_never_repeats_one():
    text = HaystackText([" One.", " Two.", " Three."], {"source": "sotu", "split": "test"})
    taken = text.take(Bytes(), 2, 8)  # from " Three." on, round to the beginning: 7 + 5 bytes
    assert [s for s, _ in taken] == [" Three.", " One."] and taken[0][1] == list(b" Three.")
    with pytest.raises(ConfigError, match="a haystack of 30 tokens needs more text than the 17 tokens of --data sotu "
                                          "--split test; use --split all"):
        text.take(Bytes(), 0, 30)


def test_a_needle_that_occurs_in_the_text_or_in_another_needle_is_drawn_again():
    first = new_key(random.Random(5))
    assert draw(random.Random(5), new_key, "nothing here", set()) == first
    again = draw(random.Random(5), new_key, f"the {first} said", set())
    assert again != first and again not in f"the {first} said"
    taken = {first}
    assert draw(random.Random(5), new_key, "", taken) != first and len(taken) == 2
    assert len(new_value(random.Random(0))) == 7
    with pytest.raises(ConfigError, match="1000 draws of a needle all occur in the haystack text"):
        draw(random.Random(0), lambda rng: "x", "x", set())
