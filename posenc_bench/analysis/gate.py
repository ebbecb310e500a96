"""CI regression gate: compare a run's results with a committed baseline, cell by cell.

For every (encoding row, eval length) of the baseline the gate checks each metric of the records' kind that
names a tolerance in the metric registry (``posenc_bench/metrics``; a plugin's metric is gated the same way,
with its own default tolerance). For text that is two numbers, each a relative rise against an allowed
tolerance:

- ``ppl``: mean perplexity over seeds;
- ``ratio``: the extrapolation ratio ppl(kx) / ppl(1x) (each seed's own ratio, then the mean), at every
  length but the train length. A change that makes every length worse by the same factor moves ppl but not
  the ratio; a change that hurts only long lengths moves both.

The allowed rise is the configured tolerance (``gate.ppl_tol``, ``gate.ratio_tol``, overridable per
encoding row under ``gate.per_encoding``), widened where noise could explain more:

- when both files carry per-unit numbers (``analysis/stats/intervals.py``), a change fails only when it is beyond
  the tolerance AND its 95% interval excludes 0: the interval of current / baseline - 1, paired over the same
  eval units (both runs scored the same text) and seed by seed (``Intervals.compare``: on the log scale, the
  seeds' t part with the text's document bootstrap). Every check of one gate is one family, corrected by Holm
  (a false alarm fails a build), so each interval is at the Bonferroni level 1 - 5% / checks. ``allowed`` is then
  the larger of the tolerance and the change minus the interval's lower bound;
- for older baselines without them, when the baseline has two or more seeds, the tolerance is widened to
  ``gate.sigmas`` standard errors of the difference of two means, from the baseline's seed spread:
  ``sigmas * std / mean * sqrt(1/n_baseline + 1/n_current)``, so seed noise does not fail the gate.

The table says which bound decided each check (``allowed_from``).

A task run (``bench/tasks``: exact match) is gated on ``accuracy``, the mean exact match over seeds at every
size: its *drop* in points (baseline - current) against ``gate.acc_tol``, widened by the paired interval of the
difference at one seed (the same test instances in both runs), or the baseline's seed spread as above over
several seeds (exact match over seeds has no valid interval: ``analysis/stats/intervals.py``).

Verdicts: ``ok``; ``improved`` (better by more than allowed: consider updating the baseline);
``REGRESSED`` (worse by more than allowed, or ok in the baseline but n/a or diverged now); ``MISSING``
(in the baseline, not in the current run: fails, a dropped encoding must not pass silently); ``new`` (no
baseline to compare with: reported, not gated); ``n/a`` (not applicable in both, e.g. a learned table past
its length).

Results are comparable only when measured the same way: same corpus and eval tokens (fingerprints), model,
training, data and evaluation settings, precision and window. Anything else is refused with the field named.
Results of two kinds (a training run and an eval, or evals of a Hugging Face model and of a checkpoint of ours)
have different fields, so they are refused in one line that says what each side is, and --update-baseline
does not replace a baseline by results of another kind.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from posenc_bench import metrics
from posenc_bench.errors import PosencError
from posenc_bench.bench.records import ResultsError, differences, read_results
from posenc_bench.analysis.captions import kind, kind_text
from posenc_bench.analysis.stats.estimate import Comparison
from posenc_bench.analysis.stats.family import HOLM, correct
from posenc_bench.analysis.stats.intervals import CI, Intervals
from posenc_bench.analysis.stats.seeds import Seeds, mean_std, over_seeds, with_value
from posenc_bench.analysis.runs import train_len
from posenc_bench.files import atomic_write_json, atomic_write_text

PASS, FAIL = 0, 1


class GateError(PosencError):
    """Usage error: missing or unreadable baseline, incomparable results (exit code 2)."""


@dataclass
class Tolerance:
    ppl_tol: float
    ratio_tol: float
    sigmas: float
    acc_tol: float = 0.05

    def of(self, metric: metrics.Metric) -> float:
        """The allowed change of ``metric``: the config's field it names, else the metric's own default."""
        return getattr(self, metric.gate_tolerance, metric.tolerance)


@dataclass
class Check:
    encoding: str
    eval_len: int
    train_len: int
    metric: str  # ppl | ratio | - (for a whole row or cell: missing / new / status change)
    baseline: Optional[float] = None
    current: Optional[float] = None
    change: Optional[float] = None  # relative: current / baseline - 1 (accuracy: the drop, baseline - current)
    allowed: Optional[float] = None  # relative rise allowed
    allowed_from: str = ""  # "tolerance" | "interval (95%, paired)" | "seed spread (3 sigma, 3 vs 3 seeds)"
    verdict: str = "ok"
    detail: str = ""
    lo: Optional[float] = None  # the change's interval, when both files carry per-unit numbers
    hi: Optional[float] = None

    @property
    def failed(self) -> bool:
        return self.verdict in ("REGRESSED", "MISSING")

    def length(self) -> str:
        k = self.eval_len / self.train_len if self.train_len else 0
        return f"{k:g}x ({self.eval_len})" if self.eval_len else "all"


@dataclass
class GateResult:
    checks: list[Check]
    notes: list[str] = field(default_factory=list)
    baseline: str = ""
    current: str = ""

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.failed]

    @property
    def exit_code(self) -> int:
        return FAIL if self.failed else PASS

    def summary(self) -> str:
        n = len([c for c in self.checks if c.metric in metrics.names()])
        improved = [c for c in self.checks if c.verdict == "improved"]
        if self.failed:
            worst = "; ".join(_describe(c) for c in self.failed[:8]) + (" ..." if len(self.failed) > 8 else "")
            return f"gate: FAIL: {len(self.failed)} regression(s) in {n} checks: {worst}"
        text = f"gate: PASS: {n} checks, no regression"
        if improved:
            text += (f"; {len(improved)} improved beyond tolerance ("
                     + ", ".join(f"{c.encoding} {c.metric} at {c.length()}" for c in improved[:5])
                     + "): if intended, update the baseline with --update-baseline")
        return text


def _describe(c: Check) -> str:
    if c.change is not None and metrics.get(c.metric).difference:
        return f"{c.encoding} accuracy at {c.length()} down {c.change:.3f} > allowed {c.allowed:.3f}"
    if c.change is not None:
        return f"{c.encoding} {c.metric} at {c.length()} {c.change:+.2%} > allowed {c.allowed:+.2%}"
    return f"{c.encoding} at {c.length()}: {c.detail}"


# ----------------------------------------------------------------------------------------- comparable?


def same_kind(baseline: dict, current: dict, then: str) -> None:
    """Refuse, in one line saying what each side is, results of two kinds (``captions.kind``: a training run, an
    eval of a Hugging Face model, an eval of a checkpoint of ours): each kind has its own identity fields, so the
    fields where they differ say nothing useful. ``then``: what to do instead."""
    b, c = baseline["run"], current["run"]
    if kind(b) != kind(c):
        raise GateError(f"the current results are {kind_text(c)}, the baseline {kind_text(b)}: {then}")


def incomparable(baseline: dict, current: dict) -> list[str]:
    """The fields where two results differ (the one identity rule, ``bench.records``), as
    'field: baseline X, current Y'."""
    return [f"{field}: baseline {b!r}, current {c!r}" for field, b, c in
            differences(baseline["run"], current["run"], baseline["records"], current["records"])]


# ---------------------------------------------------------------------------------------------- compare


def gated(data: dict) -> list[metrics.Metric]:
    """The metrics the gate checks on a results file's records: those of its kind that name a tolerance (ppl and
    the ratio to 1x for text, exact match for a task), the kind's primary metric first."""
    kind = metrics.kind_of(data["records"])
    found = [m for m in metrics.of_kind(kind.name) if m.gate_tolerance is not None]
    return sorted(found, key=lambda m: m.name != kind.primary)


def _cells(data: dict) -> dict[tuple[str, int], dict[str, Seeds]]:
    """(row, eval length) -> each gated metric's values over the seeds (``analysis/stats/seeds.py``)."""
    out: dict[tuple[str, int], dict[str, Seeds]] = {}
    for m in gated(data):
        records, key = with_value(data["records"], m)
        groups: dict[tuple[str, int], list[dict]] = {}
        for r in records:
            groups.setdefault((r["encoding"], r["eval_len"]), []).append(r)
        for cell, group in groups.items():
            out.setdefault(cell, {})[m.name] = over_seeds(group, key)
    return out


def _change(m: metrics.Metric, baseline: float, current: float) -> float:
    """How much worse ``current`` is than ``baseline`` (negative: better): a relative rise of a ratio-compared
    metric, a drop in points of a share."""
    if m.difference:
        return baseline - current if m.higher_is_better else current - baseline
    return baseline / current - 1 if m.higher_is_better else current / baseline - 1


def _check(enc: str, L: int, T: int, metric: str, b: list[float], c: list[float], limits: tuple[float, float],
           paired_change: Optional[Comparison] = None) -> Check:
    """One metric of one cell: ``limits`` (tolerance, sigmas); ``paired_change`` current against baseline, paired
    by seed and text and corrected within the gate's family (``_paired_changes``), if both runs have units."""
    tol, sigmas = limits
    m = metrics.get(metric)
    bm, bs = mean_std(b)
    cm, _ = mean_std(c)
    change = _change(m, bm, cm)
    allowed, source = tol, "tolerance"
    if paired_change is not None and math.isfinite(paired_change.interval.lo):
        i = paired_change.interval  # current / baseline, or current - baseline for a share
        if m.difference:
            lo, hi = (0.0 - i.hi, 0.0 - i.lo) if m.higher_is_better else (i.lo, i.hi)  # 0.0 -: no "-0.00%"
        else:
            lo, hi = (1 / i.hi - 1, 1 / i.lo - 1) if m.higher_is_better else (i.lo - 1, i.hi - 1)
        if change - lo > tol:
            allowed, source = change - lo, f"interval ({paired_change.shown_ci:.2%}, paired, Holm)"
        verdict = "REGRESSED" if change > allowed else ("improved" if change < -tol and hi < 0 else "ok")
        return Check(enc, L, T, metric, bm, cm, change, allowed, source, verdict, lo=lo, hi=hi)
    if len(b) >= 2 and bm > 0:
        spread = sigmas * bs / (1 if m.difference else bm) * math.sqrt(1 / len(b) + 1 / len(c))
        if spread > tol:
            allowed, source = spread, f"seed spread ({sigmas:g} sigma, {len(b)} vs {len(c)} seeds)"
    verdict = "REGRESSED" if change > allowed else ("improved" if change < -allowed else "ok")
    return Check(enc, L, T, metric, bm, cm, change, allowed, source, verdict)


def compare(baseline: dict, current: dict, tolerances: dict[str, Tolerance], default: Tolerance) -> GateResult:
    """Every check of ``current`` against ``baseline`` (both results files' contents)."""
    source = ("the same eval with --update-baseline --current <that folder>" if kind(current["run"])[0] == "eval"
              else "the same config with --update-baseline --config <config>")
    same_kind(baseline, current, f"the gate compares results of one kind; make a baseline from {source} "
                                 "--baseline <a new file>")
    diffs = incomparable(baseline, current)
    if diffs:
        raise GateError(
            "the baseline and the current results are not comparable: " + "; ".join(diffs[:4])
            + (f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else "")
            + ". Regenerate the baseline from the same config with --update-baseline"
        )
    bc, cc = _cells(baseline), _cells(current)
    paired = _paired(baseline, current)
    changes = _paired_changes(paired, bc, cc)
    T = train_len(baseline["run"])
    checks: list[Check] = []
    b_rows = list(dict.fromkeys(k[0] for k in bc))
    c_rows = list(dict.fromkeys(k[0] for k in cc))
    for enc in b_rows:
        if enc not in c_rows:
            checks.append(Check(enc, 0, T, "-", verdict="MISSING", detail="in the baseline but not in the current run"))
            continue
        for (e, L), b in bc.items():
            if e == enc:
                checks += _cell_checks(enc, L, T, b, cc.get((enc, L)), tolerances.get(enc, default), changes)
    for enc in c_rows:
        if enc not in b_rows:
            checks.append(Check(enc, 0, T, "-", verdict="new",
                                detail="not in the baseline: not gated (add it with --update-baseline)"))
    return GateResult(checks, _notes(baseline, current, checks, paired))


def _cell_checks(enc: str, L: int, T: int, b: dict[str, Seeds], c: Optional[dict[str, Seeds]], tol: Tolerance,
                 changes: dict) -> list[Check]:
    """The checks of one cell: each gated metric (``b``, ``c``: baseline and current, over seeds; the primary
    metric first), or what changed when it is missing now or not ok on either side."""
    if c is None:
        return [Check(enc, L, T, "-", verdict="MISSING",
                      detail="this length is in the baseline but not in the current run")]
    primary = next(iter(b))
    b_main, c_main = b[primary], c[primary]
    if b_main.status != "ok" or c_main.status != "ok":
        if b_main.status == c_main.status:
            return [Check(enc, L, T, "-", verdict="n/a", detail=f"{b_main.status} in both")]
        if b_main.status == "ok" or c_main.status == "diverged":
            return [Check(enc, L, T, "-", verdict="REGRESSED",
                          detail=f"{b_main.status} in the baseline, {c_main.status} now: {c_main.reason}")]
        return [Check(enc, L, T, "-", verdict="improved", detail=f"{b_main.status} in the baseline, {c_main.status} now")]
    checks = []
    for name, bs in b.items():
        m, cs = metrics.get(name), c.get(name)
        if (L == T and not m.at_1x) or cs is None or not (bs.values and cs.values):
            continue
        checks.append(_check(enc, L, T, name, bs.values, cs.values, (tol.of(m), tol.sigmas), changes.get((enc, L, name))))
    return checks


def _notes(baseline: dict, current: dict, checks: list[Check], paired: Optional[Intervals]) -> list[str]:
    """What a reader of the verdicts should know: other versions or device, and which bound widened checks."""
    notes = []
    for k in ("torch", "transformers"):
        bv, cv = baseline["run"].get("versions", {}).get(k), current["run"].get("versions", {}).get(k)
        if bv != cv:
            notes.append(f"{k} {cv} now, {bv} in the baseline: small numeric differences are expected")
    if baseline["run"].get("device") != current["run"].get("device"):
        notes.append(f"device {current['run'].get('device')} now, {baseline['run'].get('device')} in the baseline")
    spread = [c for c in checks if c.allowed_from.startswith("seed spread")]
    if spread:
        notes.append(f"{len(spread)} check(s) allow more than the tolerance because of the baseline's seed spread")
    widened = [c for c in checks if c.allowed_from.startswith("interval")]
    if widened:
        notes.append(f"{len(widened)} check(s) allow more than the tolerance because the interval of the change is wider")
    if paired is None:
        notes.append("no per-unit numbers in both files: the seed-spread rule (gate.sigmas) applies")
    return notes


def _paired_changes(paired: Optional[Intervals], bc: dict, cc: dict) -> dict:
    """(row, length, metric) -> current against baseline, paired, for every gated cell both runs have: one family
    corrected by Holm (a CI gate fails a build on a single false alarm, so the family-wise error is what it keeps
    at 1 - level; each interval is then at the Bonferroni level 1 - (1 - level) / checks)."""
    if paired is None:
        return {}
    keys = [(enc, L, name) for (enc, L), b in bc.items() if (enc, L) in cc for name in b if name in cc[enc, L]]
    made = [paired.compare(name, f"current:{enc}", f"baseline:{enc}", L) for enc, L, name in keys]
    _, adjusted = correct("every gated metric of every cell", made, paired.ci, HOLM)
    return {k: c for k, c in zip(keys, adjusted) if c is not None}


def _paired(baseline: dict, current: dict) -> Optional[Intervals]:
    """The intervals of both runs together (rows ``baseline:<row>``, ``current:<row>``): they scored the same
    text, so each draw takes the same units in both. None when either lacks per-unit numbers."""
    if not all(any(r.get("units") for r in d["records"]) for d in (baseline, current)):
        return None
    records = [{**r, "encoding": f"{side}:{r['encoding']}"} for side, d in (("baseline", baseline), ("current", current))
               for r in d["records"]]
    iv = Intervals(records, ci=CI)
    return iv if iv.available else None


# ------------------------------------------------------------------------------------------------ output


def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{x:+.2%}"


def _num(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.4f}"


_BOUND = {"tolerance": "tolerance", "interval": "interval", "seed": "seed spread"}


def markdown(result: GateResult) -> str:
    from tabulate import tabulate

    rows = [[c.encoding, c.length(), c.metric, _num(c.baseline), _num(c.current), _pct(c.change),
             "" if c.lo is None else f"[{_pct(c.lo)}, {_pct(c.hi)}]", _pct(c.allowed),
             _BOUND.get(c.allowed_from.split(" ")[0], "") if c.allowed is not None else "",
             f"**{c.verdict}**" if c.failed else c.verdict, c.detail] for c in result.checks]
    table = tabulate(rows, headers=["encoding", "length", "metric", "baseline", "current", "change", "interval",
                                    "allowed", "decided by", "verdict", "note"], tablefmt="github", disable_numparse=True,
                     colalign=("left", "left", "left", "right", "right", "right", "right", "right", "left", "left",
                               "left"))
    lines = [result.summary(), "", f"baseline: {result.baseline}  ", f"current: {result.current}", "", table]
    if result.notes:
        lines += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def as_json(result: GateResult, tolerance: Tolerance, per_encoding: dict) -> dict:
    return {
        "verdict": "fail" if result.failed else "pass",
        "exit_code": result.exit_code,
        "summary": result.summary(),
        "baseline": result.baseline,
        "current": result.current,
        "tolerance": asdict(tolerance),
        "per_encoding": per_encoding,
        "notes": result.notes,
        "checks": [asdict(c) | {"failed": c.failed} for c in result.checks],
    }


def read_baseline(path: Path | str) -> dict:
    path = Path(path)
    if not path.exists():
        raise GateError(f"baseline {str(path)!r} not found; create it from a trusted run with "
                        f"`posenc-bench gate --config <config> --baseline {path} --update-baseline`")
    try:
        return read_results(path)
    except ResultsError as e:
        raise GateError(f"baseline: {e}") from None


def write_baseline(path: Path | str, data: dict) -> None:
    atomic_write_json(path, data)


def write_outputs(out: Path | str, result: GateResult, tolerance: Tolerance, per_encoding: dict) -> tuple[Path, Path]:
    out = Path(out)
    md, js = out / "gate.md", out / "gate.json"
    atomic_write_text(md, markdown(result))
    atomic_write_text(js, json.dumps(as_json(result, tolerance, per_encoding), indent=1) + "\n")
    return md, js
