"""Tiny results files built by hand, for the analysis tests: records of one run at train length 100."""

import json
import math
from pathlib import Path

from posenc_bench.bench.config import RunConfig


def rec(enc, seed, L, ppl, status="ok", reason=""):
    return {"encoding": enc, "seed": seed, "train_len": 100, "eval_len": L, "ratio": L / 100, "status": status,
            "reason": reason, "ppl": ppl, "bpb": None, "loss": None, "tokens": 10}


# rope: two seeds (4 and 6 at 1x, 8 and 9 at 2x); learned: n/a past its table; bad: diverged everywhere
RECORDS = [
    rec("rope", 0, 100, 4.0), rec("rope", 1, 100, 6.0), rec("rope", 0, 200, 8.0), rec("rope", 1, 200, 9.0),
    rec("learned", 0, 100, 5.0), rec("learned", 0, 200, None, "n/a", "table has 100 rows"),
    rec("bad", 0, 100, None, "diverged", "diverged at step 3"), rec("bad", 0, 200, None, "diverged", "diverged at step 3"),
]


def run_meta(rows, train_len=100, seeds=(0, 1)):
    cfg = RunConfig().to_dict()
    cfg["train"]["train_len"] = train_len
    cfg["seeds"] = list(seeds)
    return {"config": cfg, "rows": rows, "params": 1000, "corpus": {"source": "stdlib", "fingerprint": "abc"},
            "eval_tokens": 40, "eval_fingerprint": "def", "device": "cpu", "versions": {"torch": "2"},
            "git_commit": "0123456789abcdef"}


def results(rows=("rope", "learned", "bad"), records=None, **kw):
    """A results file's contents; bpb = ppl / 10, so the bits-per-byte table has numbers of its own."""
    recs = [dict(r, bpb=(r["ppl"] or 0) / 10 or None) for r in (records or RECORDS)]
    return {"schema_version": 1, "run": run_meta(list(rows), **kw), "records": recs}


def write(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(data))
    return folder


def urec(enc, seed, L, unit_nll, key=None, tokens=50, by_pos=None):
    """A record with per-unit numbers (as bench/evaluate writes them) and the ppl they give."""
    r = rec(enc, seed, L, math.exp(sum(unit_nll) / (tokens * len(unit_nll))))
    r.update(cell_key=key or f"{enc}-{seed}", bpb=None,
             units={"size": 200, "nll": list(unit_nll), "tokens": [tokens] * len(unit_nll),
                    "bytes": [tokens] * len(unit_nll)})
    if by_pos is not None:
        r["loss_by_position"] = [{"start": 0, "end": 8, "loss": by_pos[0], "tokens": 5},
                                 {"start": 50, "end": 100, "loss": by_pos[1], "tokens": 5}]
    return r


def unit_results(seeds=(0,), n=40):
    """rope and rope-ntk evaluate the same model (one cell key); alibi is another model; nope does not use context."""
    import numpy as np

    rng = np.random.default_rng(0)
    text = rng.gamma(50, 1.5, size=n)  # unit NLL sums: 50 targets each, mean NLL 1.5
    recs = []
    for s in seeds:
        shift = 0.0 if len(seeds) == 1 else 1.0 * (s - 1)
        recs += [urec("rope", s, 100, text + shift, key=f"m{s}", by_pos=(2.0, 1.6)),
                 urec("rope", s, 200, text * 1.3 + shift, key=f"m{s}"),
                 urec("rope-ntk", s, 100, text + shift, key=f"m{s}"),
                 urec("rope-ntk", s, 200, text * 1.1 + shift, key=f"m{s}"),
                 urec("alibi", s, 100, text * 1.001 - shift, by_pos=(2.0, 1.7)),  # another model: its own seed luck
                 urec("alibi", s, 200, text * 1.0005 - shift),
                 urec("nope", s, 100, text * 1.5 + shift, by_pos=(2.2, 2.19)),
                 urec("nope", s, 200, text * 1.6 + shift)]
    return {"schema_version": 1, "run": run_meta(["rope", "rope-ntk", "alibi", "nope"], seeds=seeds), "records": recs}


def arec(enc, seed, L, correct, key=None, by_depth=None):
    """A task record (metric accuracy, train size 100) with per-instance units: ``correct`` 0/1 per instance,
    each instance with 4 answer tokens, of which 4 are right when correct and 2 otherwise."""
    r = rec(enc, seed, L, None)
    right = [4 if c else 2 for c in correct]
    r.update(metric="accuracy", accuracy=sum(correct) / len(correct), token_accuracy=sum(right) / (4 * len(correct)),
             cell_key=key or f"{enc}-{seed}", units={"size": 1, "correct": list(correct), "right": right,
                                                      "tokens": [4] * len(correct)})
    if by_depth is not None:
        r["by_depth"] = by_depth
    return r


def task_results(records, rows=("rope", "alibi"), seeds=(0, 1)):
    meta = run_meta(list(rows), seeds=seeds)
    meta["corpus"] = {"source": "task:copy", "fingerprint": "t", "task": "copy", "options": {}, "paper": "p"}
    meta["config"]["task"] = {"name": "copy", "train_size": 100, "min_size": 1, "options": {}, "eval_instances": 40,
                              "eval_seed": 0}
    return {"schema_version": 1, "run": meta, "records": records}
