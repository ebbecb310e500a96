"""Key-token perplexity (LongPPL) and the share of targets that are key tokens, at each eval length.

Fang et al., ICLR 2025, "What is Wrong with Perplexity for Long-context Language Modeling?" (PKU-ML/LongPPL,
``pip install longppl``): perplexity restricted to the **key tokens**, the targets whose NLL under an evaluator
model drops by more than alpha = 2 nats with the long context against a short one (and whose long-context
log-probability is above beta = -2): ``bench/eval/key_tokens.py`` identifies them at each eval length, and the
evaluation sums each unit's NLL over them (``units["key_nll"]``) and counts them (``units["key_tokens"]``). So
LongPPL = exp(sum key NLL / sum key tokens) over any multiset of units, exactly as ``compute_longppl`` takes
``exp(loss_key.mean())`` (``longppl/longppl.py``). Plain perplexity averages over every target, most of which
need only a few hundred tokens of context; LongPPL tracks whether a row uses the context past its train length.

Lower is better; rows compare as a ratio (the same key tokens for every row: the evaluator's). Not at 1x: at the
train length no target has a longer context than a short one, so there are no key tokens. A unit with no key
tokens adds nothing, so the text's independent clusters are those holding key tokens (its interval's spread
and degrees of freedom are theirs: with all the key tokens in one cluster there is no interval and no finding);
a draw of the text with none has no value (NaN: left out of the interval); a length whose text has none has no
value (its cells n/a, with ``NO_KEY_TOKENS``); records without key-token fields (key
tokens not identified, or at 1x) have no value. Not gated: the key set is a few
percent of the targets, and the gate's tolerances were set on all of them. Its figure (LongPPL against eval
length, from 1.5x on) is drawn for the folders whose records hold key tokens; ``plot`` skips it elsewhere.

``key_share``: the share of the targets that are key tokens, the evaluator's and the text's, the same for every
row (a row's table of it is the evaluator's), so it says how much of the text the LongPPL column rests on.
"""

from __future__ import annotations

import numpy as np

from posenc_bench.metrics.registry import SHARE, Metric, register

NO_KEY_TOKENS = ("no key tokens at this length: the evaluator's long context lowered no target's loss by alpha "
                 "(see the share of key tokens)")

LONGPPL = register(Metric(
    "longppl", kind="ppl",
    title=("Key-token perplexity, LongPPL (lower is better; the targets the evaluator needs the long context for; "
           "columns: eval length as a multiple of the train length)"),
    units=("key_nll", "key_tokens"), formula=lambda s: np.exp(s["key_nll"] / s["key_tokens"]),
    at_1x=False, no_value=NO_KEY_TOKENS, weight="key_tokens",
    compare_title="LongPPL relative to {ref} at the same length (paired, on the same key tokens)",
    plot=("Key-token perplexity (LongPPL) against eval length (the evaluator's key tokens, the same for every row; "
          "none at the train length). Bands: each row's own {ci} interval, unpaired\n(the seeds' range where they "
          "disagree on learning): the paired comparisons are `report --value longppl`'s", "LongPPL (lower is better)",
          "longppl_vs_length"),
))

KEY_SHARE = register(Metric(
    "key_share", kind="ppl",
    title="Share of the targets that are key tokens (the evaluator's: the same for every row)",
    units=("key_tokens", "tokens"), formula=lambda s: s["key_tokens"] / s["tokens"],
    bounds=SHARE, at_1x=False, ranked=False, digits=4,
))
