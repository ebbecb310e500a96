"""Does a ranking survive a change of setting? The same rows under several settings (tokenizer, model size, ...).

Each setting is one results folder of the same rows on the same corpus (a setting's own eval tokens: its
tokenizer's). From those files alone (``posenc-bench report SETTING... --robustness [--claims HEADLINE]``):

- **the ratio table**: each row's ppl at its longest length over its own 1x, per setting, with the interval of
  ``analysis/stats/intervals.py`` (seed level with two seeds or more; the t quantile of k - 1 degrees of freedom makes
  two seeds' intervals wide: 12.7 standard errors at 95%);
- **context use**: each row's 1x loss over its first positions minus over the second half of its window, per
  setting (``analysis/context.py``), with the measure's noise scale there; a row below PLATEAU_MARGIN is flagged
  there, and its cells in the ratio table are marked, since a flat 4x / 1x from a model that predicts from local
  context says little about its encoding. Positions are the setting's tokens: with a subword tokenizer the first
  bucket spans several times the text it spans with bytes, so the columns of two tokenizers measure different
  spans;
- **bits per byte** at 1x and at the longest length, per setting: the unit two tokenizers share;
- **the ranking's agreement**: Kendall's tau-b between the settings' rankings of the rows by mean ppl at the
  longest length, on the rows both hold, with the pairs whose order flips;
- **the claims**: every finding of the claims run (``analysis/findings.py``, by default the first setting) at its
  longest length, between rows all settings hold, checked in each setting: *holds* (the setting's interval
  supports it too), *reversed* (it supports the opposite), or not shown there, said with the direction of its
  point estimate (*same way* or *other way*). A setting with one seed of a row has only a checkpoint-level
  interval (the text's): its cells say "this checkpoint", and the claim does not count as holding there. A claim
  that points its way in every setting without holding in each is further told apart by its seeds: *every seed*
  where each seed of each setting, on its own, points the claim's way too (a count, not an interval).

``posenc-bench plot SETTING... --robustness`` draws the ratio table (``plot``), with each seed's own ratio beside
each interval.

Ratios to 1x compare across tokenizers as "how much worse at 4x its train length"; absolute ppl does not (a
token is a byte in one setting and about four in another): compare bits per byte for that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Optional, Sequence

from posenc_bench.analysis.context import PLATEAU_MARGIN, context_positions, context_use, late_spread, plateau_rows
from posenc_bench.analysis.findings import Finding, run_findings
from posenc_bench.analysis.stats.estimate import CHECKPOINT, Comparison, Interval
from posenc_bench.analysis.stats.family import correct
from posenc_bench.analysis.stats.intervals import CI, Intervals, seed_values
from posenc_bench.analysis.runs import Run, row_order, train_len

HOLDS, REVERSED, SAME_WAY, OTHER_WAY, MISSING = "holds", "reversed", "same way, not shown", "other way, not shown", "n/a"
PLATEAU_MARK = "†"  # on a cell: the plateau check flags the row in that setting (Setting.flat)


@dataclass
class Setting:
    run: Run
    iv: Intervals
    T: int  # train length
    longest: int  # longest eval length
    flat: frozenset[str]  # the rows the plateau check flags here (context.plateau_rows)

    @classmethod
    def of(cls, run: Run, ci: float) -> "Setting":
        records = run.data["records"]
        lengths = sorted({r["eval_len"] for r in records})
        return cls(run, Intervals(records, ci=ci), train_len(run.data["run"]), lengths[-1],
                   frozenset(plateau_rows(records)))

    @property
    def label(self) -> str:
        return self.run.label or self.run.path

    def ppl_means(self, rows: Sequence[str]) -> dict[str, float]:
        """Mean ppl over seeds at the longest length, of each of ``rows`` that has one."""
        out = {}
        for row in rows:
            iv = self.iv.interval("ppl", row, self.longest)
            if iv is not None and math.isfinite(iv.value):
                out[row] = iv.value
        return out


def kendall_tau(a: dict[str, float], b: dict[str, float]) -> tuple[float, int, list[tuple[str, str]]]:
    """(tau-b, rows compared, the pairs ordered one way in ``a`` and the other in ``b``) over the rows both hold."""
    rows = [r for r in a if r in b]
    concordant = discordant = ties_a = ties_b = 0
    flips = []
    for x, y in combinations(rows, 2):
        da, db = a[x] - a[y], b[x] - b[y]
        if da == 0 or db == 0:
            ties_a += da == 0
            ties_b += db == 0
            continue
        if (da > 0) == (db > 0):
            concordant += 1
        else:
            discordant += 1
            flips.append((x, y) if da < 0 else (y, x))  # the pair as ``a`` orders it (better first)
    n0 = len(rows) * (len(rows) - 1) / 2
    denom = math.sqrt((n0 - ties_a) * (n0 - ties_b))
    return ((concordant - discordant) / denom if denom else float("nan")), len(rows), flips


@dataclass(frozen=True)
class Check:
    """How one claim fares in one setting: its status, the setting's interval, and that interval's level."""

    status: str
    got: Optional[Interval] = None
    level: Optional[str] = None  # METHOD, or CHECKPOINT: one seed there, about that checkpoint only
    seeds_agree: int = 0  # how many of the setting's seeds point the claim's way, each on its own
    seeds: int = 0

    @property
    def every_seed(self) -> bool:
        return self.seeds > 0 and self.seeds_agree == self.seeds

    def cell(self) -> str:
        if self.got is None:
            return self.status
        one_seed = " (this checkpoint)" if self.level == CHECKPOINT else ""
        return f"{self.status}{one_seed} {self.got.value:.3f} [{self.got.lo:.3f}, {self.got.hi:.3f}]"


def _measure(setting: Setting, f: Finding, kind: str) -> Optional[tuple[Comparison, bool, "object"]]:
    """Claim ``f`` (of ``kind``: between | from_1x | extrapolation) in ``setting`` at the same multiple of its train
    length: (the setting's comparison, whether the claim says "above 1", each seed's own value); None without
    numbers."""
    length = round(f.length / f.train_len * setting.T)
    iv = setting.iv
    if kind == "from_1x":
        c = iv.against_null("ratio", f.better, length)
        if c is None:
            return None
        return c, f.comparison.value > 1, seed_values(iv, "ratio", f.better, length)
    value = "ppl" if kind == "between" else "ratio"
    c = iv.compare(value, f.better, f.worse, length)
    if c is None:
        return None
    return c, False, seed_values(iv, value, f.better, length, f.worse)


def _check(measured, c: Optional[Comparison]) -> Check:
    """How a claim fares where it was measured (``_measure``), ``c`` its comparison after the family's correction."""
    if measured is None:
        return Check(MISSING)
    _, want_up, each = measured
    up = c.value > 1
    agree = int(((each > 1) == want_up).sum())  # each seed's own ratio on the whole text, the claim's way
    status = (HOLDS if up == want_up else REVERSED) if c.significant else (SAME_WAY if up == want_up else OTHER_WAY)
    return Check(status, c.interval, c.level, agree, len(each))


def check(setting: Setting, f: Finding, kind: str) -> Check:
    """How claim ``f`` fares in ``setting`` on its own (a family of one): the report corrects every claim in every
    setting together instead (``_claims_block``)."""
    measured = _measure(setting, f, kind)
    return _check(measured, measured[0] if measured else None)


def _claim_what(f: Finding, kind: str) -> str:
    return {"between": f"{f.better} < {f.worse} (ppl)", "from_1x": f"{f.better} vs its 1x",
            "extrapolation": f"{f.better} < {f.worse} (ratio to 1x)"}[kind]


def _claim_text(f: Finding, kind: str) -> str:
    i = f.comparison.interval
    return f"{_claim_what(f, kind)}: {i.value:.3f} [{i.lo:.3f}, {i.hi:.3f}]"


def markdown(settings_runs: Sequence[Run], claims_run: Optional[Run] = None, *, ci: float = CI) -> str:
    """The robustness report (module docstring) of ``settings_runs``, with the claims of ``claims_run``."""
    settings = [Setting.of(r, ci) for r in settings_runs]
    claims = Setting.of(claims_run, ci) if claims_run is not None else settings[0]
    rows = [r for r in row_order(settings[0].run.data) if all(r in s.iv.rows for s in settings)]
    out = [f"Each row's ppl at the longest length over its own 1x, {ci:.0%} intervals:\n", "| row | " + " | ".join(f"{s.label} ({s.longest // s.T}x)" for s in settings) + " |",
           "|---|" + "---|" * len(settings)]
    for row in rows:
        cells = []
        for s in settings:
            got = s.iv.interval("ratio", row, s.longest)
            one_seed = " (this checkpoint)" if s.iv.level(row, s.longest) == CHECKPOINT else ""
            flat = f" {PLATEAU_MARK}" if row in s.flat else ""
            cells.append("n/a" if got is None or not math.isfinite(got.value)
                         else f"{got.value:.2f} [{got.lo:.2f}, {got.hi:.2f}]{one_seed}{flat}")
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    out += ["", _context_block(settings, rows), "", _bpb_block(settings, rows)]
    means = {s.label: s.ppl_means(rows) for s in settings}
    out += ["", "Rankings by mean ppl at the longest length (best first):\n"]
    out += [f"- {label}: " + " < ".join(sorted(m, key=m.get)) for label, m in means.items()]
    out += ["", "Kendall's tau-b between the rankings (1: the same order; 0: unrelated), and the pairs that flip:\n"]
    for a, b in combinations(settings, 2):
        tau, n, flips = kendall_tau(means[a.label], means[b.label])
        flipped = "; ".join(f"{x} < {y} in {a.label}, not in {b.label}" for x, y in flips) or "none"
        out.append(f"- {a.label} vs {b.label}: tau {tau:.2f} over {n} rows; flips: {flipped}")
    out += ["", _claims_block(claims, settings, rows)]
    return "\n".join(out) + "\n"


def _bpb_block(settings: list[Setting], rows: list[str]) -> str:
    """Each row's bits per byte at 1x and at the longest length per setting: the one unit two tokenizers share."""
    head = ("Bits per byte at 1x and at the longest length (the mean over the row's seeds): the measure two "
            "tokenizers share. Each setting scores its own eval text (the same test speeches, cut into segments of "
            "its tokens), so across tokenizers the texts overlap but are not the same:\n")
    table = ["| row | " + " | ".join(s.label for s in settings) + " |", "|---|" + "---|" * len(settings)]
    for row in rows:
        cells = []
        for s in settings:
            at = [s.iv.interval("bpb", row, L) for L in (s.T, s.longest)]
            cells.append("n/a" if None in at else f"{at[0].value:.3f} -> {at[1].value:.3f}")
        table.append(f"| {row} | " + " | ".join(cells) + " |")
    return head + "\n" + "\n".join(table)


def _context_block(settings: list[Setting], rows: list[str]) -> str:
    """Each row's context use at 1x per setting: first-bucket loss minus second-half loss (nats a token)."""
    spans = {}
    for s in settings:
        pos = next((p for row in rows if (p := context_positions(s.run.data["records"], row))), None)
        spans[s.label] = f"positions {pos[0]} vs {pos[1]}" if pos else "no loss by position"
    head = (f"{PLATEAU_MARK}: flagged by the plateau check in that setting. Context use at 1x: the loss over the "
            "first positions of the window minus the loss over its second half, nats a token, the mean over the "
            f"row's seeds; below {PLATEAU_MARGIN:g} the row is flagged ({PLATEAU_MARK}) as not using context past "
            "its first positions. Positions are the setting's tokens, so settings with different tokenizers "
            "measure different spans of text. The last line is the measure's noise scale: "
            "how much neighbouring position buckets of the second half scatter (their text differs), the mean over "
            "rows; a gap within a few of it is not measured by that setting's eval text:\n")
    table = ["| row | " + " | ".join(f"{s.label} ({spans[s.label]})" for s in settings) + " |",
             "|---|" + "---|" * len(settings)]
    for row in rows:
        cells = []
        for s in settings:
            use = context_use(s.run.data["records"], row)
            flat = f" {PLATEAU_MARK}" if row in s.flat else ""
            cells.append("n/a" if use is None else f"{use[0] - use[1]:.3f}{flat}")
        table.append(f"| {row} | " + " | ".join(cells) + " |")
    spreads = []
    for s in settings:
        got = [x for row in rows if (x := late_spread(s.run.data["records"], row)) is not None]
        spreads.append(f"{sum(got) / len(got):.3f}" if got else "n/a")
    table.append("| (bucket scatter) | " + " | ".join(spreads) + " |")
    flagged = [f"{s.label}: {', '.join(r for r in rows if r in s.flat)}" for s in settings if s.flat & set(rows)]
    tail = ("Flagged: " + "; ".join(flagged) + ".") if flagged else "No row is flagged in any setting."
    return head + "\n" + "\n".join(table) + "\n\n" + tail


def _claims_block(claims: Setting, settings: list[Setting], rows: list[str]) -> str:
    fs = run_findings(claims.run, claims.iv)
    keep = set(rows)
    items = [(f, kind) for kind, found in (("between", fs.between), ("extrapolation", fs.extrapolation),
                                           ("from_1x", fs.from_1x))
             for f in found if f.length == claims.longest and f.better in keep and (not f.worse or f.worse in keep)]
    items.sort(key=lambda fk: (-fk[0].effect, _claim_text(*fk)))
    head = (f"Claims of {claims.label} at its longest length ({claims.longest // claims.T}x) between rows every "
            f"setting holds, checked in each setting at the same multiple: *{HOLDS}* (a finding there, after the "
            "correction for every claim in every setting), "
            f"*{REVERSED}*, or not shown there and which way its estimate points. A setting with one seed of a row "
            "speaks for that checkpoint only, so a claim holds in every setting only at the seed level in each.\n")
    if not items:
        return head + "\n(no claim at that length)\n"
    table = ["| claim | " + " | ".join(s.label for s in settings) + " | in every setting |",
             "|---|" + "---|" * (len(settings) + 1)]
    measured = [[_measure(s, f, kind) for s in settings] for f, kind in items]
    family, adjusted = correct("every claim in every setting", [m[0] if m else None for ms in measured for m in ms],
                               claims.iv.ci)
    it = iter(adjusted)
    every, same_way, every_seed, reversed_ = 0, 0, 0, []
    for (f, kind), ms in zip(items, measured):
        checked = [_check(m, next(it)) for m in ms]
        holds = all(c.status == HOLDS and c.level != CHECKPOINT for c in checked)
        # the claim's way in every setting, but not shown at the seed level in some: a checkpoint's word, or
        # an interval too wide (few seeds) or an effect too small there
        same = not holds and all(c.status in (HOLDS, SAME_WAY) for c in checked)
        seeds_too = same and all(c.every_seed for c in checked)
        every, same_way, every_seed = every + holds, same_way + same, every_seed + seeds_too
        where = [s.label + (" for this checkpoint" if c.level == CHECKPOINT else "")
                 for s, c in zip(settings, checked) if c.status == REVERSED]
        if where:
            reversed_.append(f"{_claim_what(f, kind)} (in {', '.join(where)})")
        table.append(f"| {_claim_text(f, kind)} | " + " | ".join(c.cell() for c in checked)
                     + f" | {'yes' if holds else 'same way, every seed' if seeds_too else 'same way' if same else 'no'}"
                     + " |")
    which = f": {'; '.join(reversed_)}" if reversed_ else ""
    said = family.describe()
    return (head + f"\n{said[0].upper() + said[1:]} ({len(items)} claims x {len(settings)} settings; intervals at the "
            f"false-coverage-adjusted level). {every} of {len(items)} claims hold in every setting; {same_way} more point the claim's way "
            "in every setting without being shown at the seed level in each (*same way* in the last column), "
            f"{every_seed} of them at every seed of every setting, each seed's own ratio on the whole text (*same "
            f"way, every seed*: a count, not an interval); {len(reversed_)} are reversed in at least one{which}."
            "\n\n" + "\n".join(table) + "\n")


def plot(runs: Sequence[Run], out: Path, formats: Optional[Sequence[str]] = None, stem: str = "robustness"
         ) -> list[Path]:
    """The ratio table as a figure: each row's ppl at the longest length over its own 1x, one marker per setting
    with its interval and an x per seed (that seed's own ratio: two seeds make a wide interval, and the x's show
    whether they agree), for the rows every setting holds, in the first setting's order."""
    from posenc_bench.analysis import plots  # matplotlib on demand (plots sets its backend): the report needs none
    from matplotlib.ticker import FormatStrFormatter

    settings = [Setting.of(run, CI) for run in runs]
    rows = [r for r in row_order(runs[0].data) if all(r in s.iv.rows for s in settings)]
    if len(settings) < 2 or not rows:
        raise plots.PlotError("a robustness figure needs two or more settings with rows in common")
    fig, ax = plots.plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.2))
    width, seeds_drawn, flagged = 0.8 / len(settings), False, False
    for i, s in enumerate(settings):
        color, label = plots.style(i)["color"], f"{s.label} ({s.longest // s.T}x)"
        for j, row in enumerate(rows):
            got = s.iv.interval("ratio", row, s.longest)
            if got is None or not math.isfinite(got.value):
                continue
            flat = row in s.flat  # hollow: the plateau check flags the row in this setting
            ax.errorbar([j - 0.4 + width * (i + 0.5)], [got.value], fmt="o", capsize=3, color=color, label=label,
                        yerr=[[max(0.0, got.value - got.lo)], [max(0.0, got.hi - got.value)]],
                        markerfacecolor="none" if flat else color)
            label = "_nolegend_"  # one legend entry a setting
            each = seed_values(s.iv, "ratio", row, s.longest)
            several = each is not None and len(each) > 1  # with one seed the marker is the seed
            if several:
                ax.plot([j - 0.4 + width * (i + 0.85)] * len(each), each, "x", markersize=4, color=color,
                        gid=f"seeds {s.label} {row}")
            seeds_drawn, flagged = seeds_drawn or several, flagged or flat
    ax.axhline(1.0, color="0.5", linewidth=0.8)
    ax.set_xticks(range(len(rows)), rows, rotation=30, ha="right")
    ax.set_ylabel("ppl at the longest length / ppl at 1x")
    ax.set_yscale("log")
    for axis_format in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # within a decade: 2, not 2x10^0
        axis_format(FormatStrFormatter("%g"))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    notes = [note for note, drawn in (("x: each seed's own ratio", seeds_drawn),
                                      ("hollow: a row the plateau check flags in that setting", flagged)) if drawn]
    fig.suptitle(f"Extrapolation per setting: each row against its own 1x ({CI:.0%} intervals; paired by seed and text)"
                 + ("\n" + "; ".join(notes) if notes else ""))
    fig.tight_layout()  # the slanted row names inside the figure, above the caption
    plots.add_caption(fig, runs)
    return plots.save(fig, out, stem, formats or plots.FORMATS)
