"""Attention sinks: ``<encoding>+sink<S>+sw<W>`` and ``<encoding>+sw<W>+sink<S>``.

Xiao, Tian, Chen, Han & Lewis, "Efficient Streaming Language Models with Attention Sinks", ICLR 2024
(arXiv:2309.17453), sec. 3.2: a model evaluated with a rolling cache of its last W tokens keeps the first S
tokens ("attention sinks", S = 4 in the paper) in the cache as well, and positions are those within the
cache, not in the text: with the cache full (query i >= S + W), the sinks sit at 0 .. S - 1 and the recent
tokens at S .. S + W - 1, so a query sees its recent keys at their true distance and sink s at distance
S + W - 1 - s, never more than S + W - 1 whatever the length.

- ``<encoding>+sink<S>+sw<W>`` evaluates the encoding's checkpoint trained without a window, zero-shot,
  with the window and sinks (the paper's use).
- ``<encoding>+sw<W>+sink<S>`` evaluates the checkpoint trained with that window (row ``<encoding>+sw<W>``)
  with sinks added.
- ``<encoding>+sink0+sw<W>`` is the paper's control, window attention: the same zero-shot window with no
  sinks (the first tokens are evicted like any other), which the paper finds collapses once they are.

The class of such a row is the encoding's own class with ``attention_sinks`` set, so it loads the trained
weights as they are; the model's attention plan applies the visible set and the re-indexing through the
encoding's hooks (a query's rotation and bias towards the sinks are taken at its cache position). Any
trained encoding whose positions act inside attention can take sinks; an absolute encoding cannot, since its
positions are added to the token embeddings and carried in every layer's hidden states, which no cache
re-indexes (the paper, too, treats RoPE and ALiBi models).
"""

from __future__ import annotations

import re
from typing import Optional

from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.registry import available, get_class, register_pattern
from posenc_bench.errors import ConfigError

PAPER_SINKS = 4  # the paper's number of sink tokens (its code's start_size=4: streaming_llm/kv_cache.py line 26)
# ``eval.tune``'s sink counts, each at the row's cache size S + W (the recent window giving way): the paper's 4
# first, then the counts its Table 2 compares at one cache size (1, 2, 4 and 8 initial tokens; 0, window
# attention, is the control row of its own, never a tuned value).
SINK_GRID = (PAPER_SINKS, 1, 2, 8)
_NAME = re.compile(r"^(?P<base>.+?)\+sink(?P<sinks>[0-9]+)(?:\+sw(?P<window>[0-9]+))?$")


def parse(name: str) -> Optional[tuple[str, int, Optional[int]]]:
    """'rope+sink4+sw64' -> ('rope', 4, 64); 'rope+sink4' -> ('rope', 4, None) (the model's window); else None."""
    m = _NAME.match(name)
    if m is None:
        return None
    return m["base"], int(m["sinks"]), None if m["window"] is None else int(m["window"])


def _refused(base: type[Encoding]) -> str:
    """Why ``base`` cannot take attention sinks ("" when it can)."""
    if base.trained_as is not None:
        return f"it evaluates the trained {base.trained_as!r} model"
    if base.positions_in_embedding:
        return "its positions are added to the token embeddings, which attention cannot re-index"
    return base.no_sinks


@register_pattern
def sink_row(name: str) -> Optional[type[Encoding]]:
    parsed = parse(name)
    if parsed is None:
        return None
    base_name, sinks, window = parsed
    base = get_class(base_name)  # an unknown base fails here, listing the valid names
    why = _refused(base)
    if why:
        sinkable = [n for n in available() if not _refused(get_class(n))]
        raise ConfigError(f"attention sinks cannot wrap {base_name!r} ({why}); encodings that take them: "
                          f"{', '.join(sinkable)}")
    if window == 0:
        raise ConfigError(f"bad attention-sink row {name!r}: need a window W >= 1, e.g. rope+sink{PAPER_SINKS}+sw64")
    where = f"a sliding window of {window} keys" if window else "the window it was trained with"
    return type(f"{base.__name__}Sink{sinks}" + (f"Sw{window}" if window else ""), (base,), {
        "__module__": __name__,
        "tuning_grid": classmethod(_grid(base_name, sinks, window)),
        "tuned_row": classmethod(lambda cls, point: (f"{base_name}+sink{point['sinks']}+sw{point['window']}", {})),
        "trained_as": base_name,
        "family": "attention sinks (zero-shot)",
        "attention_sinks": (sinks, window),
        "summary": f"the trained {base_name} model with {where} plus the first {sinks} tokens, positions "
                   f"re-indexed within the cache (StreamingLLM), zero-shot; Xiao et al. 2024",
        "paper": f"Xiao et al., ICLR 2024, StreamingLLM (arXiv:2309.17453), over {base.paper}",
    })


def _grid(base: str, sinks: int, window: Optional[int]):
    """The ``tuning_grid`` of row ``<base>+sink<sinks>+sw<window>``: sink counts S' of ``SINK_GRID`` (the row's own
    first) with the recent window W' = S + W - S' (>= 1), the cache size kept as the paper's Table 2 keeps it;
    nothing to tune for the window-only control (S = 0), for sinks on a trained window (no W in the name,
    none here to trade), or at a length the cache holds whole (nothing is evicted: the plain model)."""

    def grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
        cache = sinks + (window or 0)
        if not sinks or window is None or eval_len <= cache:
            return []
        counts = dict.fromkeys([sinks, *SINK_GRID])
        return [{"sinks": s, "window": cache - s} for s in counts if cache - s >= 1]

    return grid
