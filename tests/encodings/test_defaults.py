"""Every encoding's constructor defaults, pinned: a changed default changes a row's numbers under the same key.

A cell key (``bench/keys.py``) hashes the options a config sets, not the defaults an encoding fills in, so a
default that moves (FIRE's ``threshold``, a quarter of the train length up to 0b4fed2 and 512 since) trains other
weights, or scores other numbers, under the key of the old ones, and a checkpoint or record made before the
change would be reused as if it were the new default. This table makes such a change visible: when it fails,
make the old results unreusable in the same change, by keying the resolved value (``Encoding.key_options`` for
the weights, ``Encoding.eval_options`` for an eval-only row) or by bumping ``NUMERICS``, then update the table.
An encoding is pinned here from its first committed results on (a new encoding needs no entry before then).
"""

import inspect
import json
from pathlib import Path
from typing import Optional

from posenc_bench import encodings
from posenc_bench.bench.rows import Row

ROOT = Path(__file__).resolve().parents[2]

ROTARY = {"theta": 10000.0}
SCALED = {**ROTARY, "factor": 0.0}
FINETUNED = {**ROTARY, "factor": None}
YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "temperature_coef": 0.1}
DEFAULTS = {
    "sinusoidal": {"base": 10000.0, "token_scale": 1.0, "pe_scale": 0.02},
    "learned": {"init_std": 0.02, "max_positions": 0},
    "rope": ROTARY,
    "rope-partial": {**ROTARY, "fraction": 0.75},
    "xpos": {**ROTARY, "scale_base": 512.0, "gamma": 0.4},
    "xpos+bca": {**ROTARY, "scale_base": 512.0, "gamma": 0.4, "block": 0},
    "fope": {**ROTARY, "gain": 0.3, "n_layers": 1},
    "rnope-swa": {"n_layers": 1, "period": 4, "window": 0, "attn_scale": 0.0, "floor_scale": 0},
    "rope-linear": SCALED, "rope-ntk": SCALED, "rope-llama3": SCALED, "rope-dynamic": {**ROTARY, "factor": 2.0},
    "rope-yarn": {**SCALED, **YARN},
    "rope-ft": ROTARY, "rope-linear-ft": FINETUNED, "rope-ntk-ft": FINETUNED, "rope-dynamic-ft": FINETUNED,
    "rope-llama3-ft": FINETUNED, "rope-yarn-ft": {**FINETUNED, **YARN},
    "rope-rerope": {**ROTARY, "window": 0},
    "rope-leaky": {**ROTARY, "window": 0, "slope": 16.0},
    "rope-selfextend": {**ROTARY, "neighbor_window": 0, "group": 0},
    "rope-string": {**ROTARY, "shift": 0, "local_window": 0, "attention_factor": 1.0693147180559945},
    "t5": {"num_buckets": 32, "max_distance": 128},
    "alibi": {}, "kerple": {}, "kerple-power": {}, "stickbreaking": {}, "nope": {},
    "fire": {"mlp_width": 32, "threshold": 512.0, "c_init": 0.1},
    "dape-kerple": {"mlp_width": 32, "n_layers": 1}, "dape-alibi": {"mlp_width": 32, "n_layers": 1},
    "cope": {"npos_max": 0, "shared": False, "n_layers": 1},
    "fox": {"n_layers": 1}, "path": {"n_layers": 1},
    # learned+rand sizes its table by its own max_position, in place of learned's max_positions
    "learned+rand": {"init_std": 0.02, "max_position": 0, "sampler": "authors", "eval_positions": "", "eval_seed": 0},
}
# The wrappers add their own options to their base's: "<base>+rand" and "<base>+ssmax".
WRAPPERS = {"+rand": {"max_position": 0, "sampler": "authors", "eval_positions": "", "eval_seed": 0},
            "+ssmax": {"n_layers": 1, "s_init": 1.0, "scale_bias": False}}


def defaults(name: str) -> dict:
    """The keyword-only options of ``name``'s constructor with their defaults (the model's sizes left out)."""
    params = inspect.signature(encodings.get_class(name).__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.kind == p.KEYWORD_ONLY and p.name not in ("d_model", "n_heads", "train_len")}


def expected(name: str) -> Optional[dict]:
    """The pinned defaults of ``name``; None for an encoding not pinned yet (no committed results)."""
    if name in DEFAULTS:
        return DEFAULTS[name]
    cls = encodings.get_class(name)
    if cls.attention_sinks is not None:  # a sink row is its base's class with a cache: the base's options
        return expected(cls.trained_as)
    for suffix, own in WRAPPERS.items():
        if name.endswith(suffix) and name[: -len(suffix)] in DEFAULTS:
            return {**DEFAULTS[name[: -len(suffix)]], **own}
    return None


def test_every_pinned_encodings_defaults_are_the_pinned_ones():
    pinned = [n for n in encodings.available() if expected(n) is not None]
    assert set(pinned) >= set(DEFAULTS) and len(pinned) > len(DEFAULTS)  # the wrapped rows are checked too
    changed = {n: (expected(n), defaults(n)) for n in pinned if defaults(n) != expected(n)}
    assert not changed, ("an encoding's defaults changed; key the resolved value or bump NUMERICS (this module's "
                         f"docstring), then update DEFAULTS: {changed}")


def test_every_encoding_with_committed_results_is_pinned():
    found = set()
    for path in (ROOT / "results").rglob("results.json"):
        for record in json.loads(path.read_text())["records"]:
            if record.get("encoding") and record.get("cell_key"):  # our models' rows (not a pretrained model's)
                row = Row.parse(record["encoding"])
                found |= {row.encoding, row.trained.encoding}
    assert found and not {n for n in found if expected(n) is None}, sorted(n for n in found if expected(n) is None)
    assert not [n for n in found if defaults(n) != expected(n)]  # the sink rows too, which available() leaves out


def test_the_table_catches_a_changed_default(monkeypatch):
    """The check can fail: FIRE back at its earlier default, the change 0b4fed2 made without a key."""
    cls = encodings.get_class("fire")
    init = cls.__init__
    signature = inspect.signature(init)
    params = [p.replace(default=0.0) if p.name == "threshold" else p for p in signature.parameters.values()]
    monkeypatch.setattr(init, "__signature__", signature.replace(parameters=params), raising=False)
    assert defaults("fire")["threshold"] == 0.0 != DEFAULTS["fire"]["threshold"]
