"""Figures from results files (matplotlib, headless): ppl against eval length, loss by position, and the
pictures people use to understand encodings (the sinusoidal table, ALiBi / T5 attention bias).

Numbers come from ``results.json`` alone. The encoding pictures are drawn by the encodings' own code with
the run's width, heads and train length; a learned bias (T5) is read from the run's checkpoint, and is
skipped, with the reason, when the checkpoint is not there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: no display needed, same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import torch  # noqa: E402

from posenc_bench import encodings, metrics  # noqa: E402
from posenc_bench.bench.rows import Row, select_rows  # noqa: E402
from posenc_bench.errors import PosencError  # noqa: E402
from posenc_bench.files import atomic_write  # noqa: E402
from posenc_bench.analysis.stats.intervals import Intervals  # noqa: E402
from posenc_bench.analysis.captions import short_caption  # noqa: E402
from posenc_bench.analysis.stats.seeds import mean_std, over_seeds, with_value  # noqa: E402
from posenc_bench.analysis.runs import Run, is_task, kind_of, row_order, train_len  # noqa: E402

FORMATS = ("png", "svg")
DPI = 110


class PlotError(PosencError):
    pass


def save(fig, out: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    """Writes ``fig`` as ``out/stem.<format>`` for each format, reproducibly and atomically, and closes it."""
    paths = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        # no timestamps or random ids in the files, so regenerated figures only differ when the data does
        metadata = {"Date": None} if fmt == "svg" else {"Software": None}
        with matplotlib.rc_context({"svg.hashsalt": "posenc-bench"}):
            atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata,
                                                       bbox_inches="tight"))
        paths.append(path)
    plt.close(fig)
    return paths


def add_caption(fig, runs: Sequence[Run]) -> None:
    """Below the figure, each run's one-line caption: what was trained and measured, where, at which commit."""
    text = "\n".join((f"{r.label}: " if r.label else "") + short_caption(r.data["run"], r.data["records"])
                     for r in runs)
    fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=7, color="0.3")


def _mean_by_length(records: list[dict], row: str, iv: Optional[Intervals] = None, value: str = "ppl"
                    ) -> list[tuple[int, float, float, float]]:
    """(eval length, estimate, error below, error above) of the metric ``value`` ("ppl", "ratio": ppl over the same
    row and seed's ppl at 1x, ...) over the seeds that are ok, for every length with at least one: the estimate
    and interval (analysis/stats/intervals.py) where ``iv`` has one; the mean and the lowest to the highest seed
    where no interval is valid (a task over seeds, seeds that disagree on learning); else mean ± std over seeds."""
    records, key = with_value(records, metrics.get(value))
    out = []
    for L in sorted({r["eval_len"] for r in records if r["encoding"] == row}):
        group = [r for r in records if r["encoding"] == row and r["eval_len"] == L]
        vals = over_seeds(group, key).values
        if vals:
            mean, std = mean_std(vals)
            i = iv.interval(value, row, L) if iv is not None and iv.available else None
            if i is not None:
                out.append((L, i.value, i.value - i.lo, i.hi - i.value))
            elif iv is not None and iv.available:  # declined: the seeds' range, no interval
                out.append((L, mean, mean - min(vals), max(vals) - mean))
            else:
                out.append((L, mean, std or 0.0, std or 0.0))
    return out


def _encodings_of(run: Run) -> list[str]:
    """The registered encodings behind a run's rows (none for a pretrained model's rows)."""
    names = []
    for row in row_order(run.data):
        try:
            names.append(Row.parse(row).encoding)
        except PosencError:
            continue
    return list(dict.fromkeys(names))


# Panels of the line figures, by what each encoding class declares (encodings.family and Encoding.newer), so a
# new encoding lands in its panel with no list to edit: the classic trained encodings; the newer trained ones;
# RoPE's zero-shot scalings and fixes, and its fine-tuned scalings (these two also draw the model they
# evaluate, rope, grey and dotted, as their reference); randomized positions; a family not named here; rows
# that are not registered encodings (a pretrained model's).
CLASSIC = ("classic absolute", "relative bias", "rotary", "none")
PANELS = (("classic encodings", CLASSIC),
          ("newer encodings", CLASSIC + ("contextual",)),
          ("RoPE, zero-shot scalings and fixes",
           ("rotary scaling (zero-shot)", "rotary fix (zero-shot)", "attention sinks (zero-shot)")),
          ("RoPE, fine-tuned", ("rotary scaling (fine-tuned)",)),
          ("randomized positions", ("randomized positions",)),
          ("other encodings", None),
          ("pretrained models", ()))
NEWER_PANEL, OTHER_PANEL = 1, len(PANELS) - 2
MARKERS = "osD^v<>ph*"


def _panel_index(row: str) -> int:
    try:
        cls = Row.parse(row).cls
    except PosencError:
        return len(PANELS) - 1
    fam = encodings.family(cls)
    return next((i for i, (_, fams) in enumerate(PANELS)
                 if fams and fam in fams and (i == NEWER_PANEL) == bool(cls.newer)), OTHER_PANEL)


def panels(rows: Sequence[str]) -> list[tuple[str, list[str], list[str]]]:
    """(title, rows, reference rows) of every panel that has rows, in PANELS order; rows keep their order."""
    out = []
    for i, (title, _) in enumerate(PANELS):
        mine = [r for r in rows if _panel_index(r) == i]
        if mine:
            refs = []
            for r in mine:
                try:
                    base = Row.parse(r).cls.trained_as
                except PosencError:
                    base = None
                if base and base in rows and base not in mine and base not in refs:
                    refs.append(base)
            out.append((title, mine, refs))
    return out


def style(index: int) -> dict:
    """Colour and marker of the index-th row of a panel: no two rows of a panel share both (10 colours x 10
    markers)."""
    return {"color": f"C{index % 10}", "marker": MARKERS[index // 10 % len(MARKERS)]}


REFERENCE = {"color": "0.55", "marker": "", "linestyle": ":"}


def _panel_axes(n: int, height: float = 4.2):
    cols = 1 if n == 1 else 2
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.2 * cols, height * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _mark_train_lengths(ax, lengths, word: str = "train length") -> None:
    for T in sorted(lengths):
        ax.axvline(T, color="0.5", linestyle=":", linewidth=1)
        ax.annotate(f"{word} {T}", (T, 0), xycoords=("data", "axes fraction"), xytext=(3, 4),
                    textcoords="offset points", fontsize=8, color="0.4")


def _line_with_band(ax, xs, ys, below, above, label: str, look: dict) -> None:
    """A row's line with its interval as a shaded band (a bar where the row has one length: a band needs two)."""
    if len(xs) == 1:
        ax.errorbar(xs, ys, yerr=(below, above) if any(below + above) else None, label=label, markersize=4,
                    capsize=2, **look)
        return
    (line,) = ax.plot(xs, ys, label=label, markersize=4, **look)
    if any(below + above):
        ax.fill_between(xs, [y - b for y, b in zip(ys, below)], [y + a for y, a in zip(ys, above)],
                        color=line.get_color(), alpha=0.15, linewidth=0)


def _selected(run: Run, rows: Optional[Sequence[str]]) -> list[str]:
    every = row_order(run.data)
    return every if rows is None else [r for r in every if r in rows]


def plot_ppl_vs_length(runs: Sequence[Run], out: Path, formats: Sequence[str] = FORMATS,
                       rows: Optional[Sequence[str]] = None, value: str = "ppl") -> list[Path]:
    """A metric with a figure (``value``: perplexity, its ratio to each row's own 1x, exact match, ...) against
    eval length, one panel per family (PANELS), one line per row (per run), the train lengths marked. ``rows``:
    only these (default every row)."""
    metric = metrics.get(value)
    suptitle, ylabel, stem = metric.plot
    order = list(dict.fromkeys(r for run in runs for r in _selected(run, rows)))
    key = metric.of or value  # the number a record must have to be drawn
    sizes = metrics.kind(metric.kind).instances  # x: instance sizes of a task, else eval lengths
    groups = [g for g in panels(order) if any(_mean_by_length(run.data["records"], r, value=key) for run in runs
                                             for r in g[1])]
    if not groups:
        raise PlotError("no ok records to plot (every cell is n/a or diverged)")
    fig, axes = _panel_axes(len(groups))
    lengths = sorted({r["eval_len"] for run in runs for r in run.data["records"]})
    ivs = [Intervals(run.data["records"]) for run in runs]
    for ax, (title, mine, refs) in zip(axes, groups):
        means = []
        for i, run in enumerate(runs):
            for j, row in enumerate(refs + mine):
                pts = _mean_by_length(run.data["records"], row, ivs[i], value)
                if not pts:
                    continue
                xs, ys, below, above = zip(*pts)
                means += ys
                label = (f"{run.label}: {row}" if run.label else row) + (" (reference)" if row in refs else "")
                if len(pts) < len({r["eval_len"] for r in run.data["records"]  # LongPPL has none at 1x
                                   if metric.at_1x or r["eval_len"] != r["train_len"]}):
                    label += f" (to {xs[-1]})"
                look = dict(REFERENCE) if row in refs else {**style(j - len(refs)), "linestyle": "-"}
                if len(runs) > 1:
                    look["linestyle"] = ["-", "--", ":", "-."][i % 4]
                _line_with_band(ax, xs, ys, below, above, label, look)
        _mark_train_lengths(ax, {r["train_len"] for run in runs for r in run.data["records"]},
                            "train size" if sizes else "train length")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.minorticks_off()
        if metric.bounds is None and means and max(means) / min(means) > 4:
            ax.set_yscale("log")
            for axis_format in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis_format(matplotlib.ticker.FormatStrFormatter("%g"))  # 6, not 6 x 10^0
        ax.set_xlabel("instance size" if sizes else "eval length (tokens)")
        if metric.bounds is not None:
            ax.set_ylim(metric.bounds[0] - 0.03, metric.bounds[1] + 0.03)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    ci = f"{ivs[0].ci:.0%}" if any(iv.available for iv in ivs) else None
    fig.suptitle(suptitle.format(ci=ci) if ci else suptitle.split(" Bands:")[0] + " Bands: ± std over seeds")
    add_caption(fig, runs)
    return save(fig, out, stem, formats)


def _loss_by_position(records: list[dict], row: str) -> tuple[int, list[tuple[float, float]]] | None:
    """At the longest length where ``row`` is ok: (length, [(bucket middle, loss)]) averaged over seeds,
    token-weighted per bucket."""
    ok = [r for r in records if r["encoding"] == row and r["status"] == "ok" and r.get("loss_by_position")]
    if not ok:
        return None
    L = max(r["eval_len"] for r in ok)
    buckets: dict[tuple[int, int], list[float]] = {}
    for r in ok:
        if r["eval_len"] == L:
            for b in r["loss_by_position"]:
                acc = buckets.setdefault((b["start"], b["end"]), [0.0, 0.0])
                acc[0] += b["loss"] * b["tokens"]
                acc[1] += b["tokens"]
    pts = [((s + e - 1) / 2, tot / n) for (s, e), (tot, n) in sorted(buckets.items()) if n]
    return L, pts


def plot_loss_by_position(run: Run, out: Path, formats: Sequence[str] = FORMATS, stem: str = "loss_by_position",
                          rows: Optional[Sequence[str]] = None) -> list[Path]:
    """Loss by position over the longest eval length, one panel per family, one line per row: where each
    encoding breaks. ``rows``: only these (default every row)."""
    longest = max(r["eval_len"] for r in run.data["records"])
    curves = {row: got for row in _selected(run, rows) if (got := _loss_by_position(run.data["records"], row))}
    groups = panels(list(curves))
    if not groups:
        raise PlotError(f"{run.path}: no record has a loss by position")
    fig, axes = _panel_axes(len(groups))
    T = train_len(run.data["run"])
    for ax, (title, mine, refs) in zip(axes, groups):
        for j, row in enumerate(refs + mine):
            L, pts = curves[row]
            xs, ys = zip(*pts)
            label = (row if L == longest else f"{row} (only to {L})") + (" (reference)" if row in refs else "")
            look = dict(REFERENCE) if row in refs else {**style(j - len(refs)), "linestyle": "-"}
            ax.plot(xs, ys, label=label, linewidth=1.3, markersize=3, markevery=8, **look)
        _mark_train_lengths(ax, {T})
        ax.set_xlabel("position in the window (tokens)")
        ax.set_ylabel("mean loss (nats per token)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    title = f"Loss by position at eval length {longest} ({longest / T:g}x the train length)"
    fig.suptitle(title + (f" - {run.label}" if run.label else ""))
    add_caption(fig, [run])
    return save(fig, out, stem, formats)


def plot_sinusoidal(d_model: int, length: int, out: Path, formats: Sequence[str] = FORMATS,
                    caption: str = "") -> list[Path]:
    """The sinusoidal table (positions x dimensions) as a heatmap, and a few dimensions' waves."""
    from posenc_bench.encodings.absolute import sinusoidal_table

    table = sinusoidal_table(length, d_model).numpy()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1.1, 1]},
                             layout="constrained")
    im = a.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    a.set_xlabel("dimension (even: sin, odd: cos)")
    a.set_ylabel("position")
    a.set_title(f"Sinusoidal table, {length} positions x {d_model} dimensions")
    fig.colorbar(im, ax=a)
    for dim in sorted({d_model // 16 * 2, d_model // 8 * 2, d_model // 4 * 2, d_model // 8 * 6}):
        b.plot(table[:, dim], label=f"dim {dim}: period {2 * math.pi * 10000 ** (dim / d_model):.4g}",
               linewidth=1)
    b.set_xlabel("position")
    b.set_ylabel("value")
    b.set_title("A few dimensions (sin columns)")
    b.grid(True, alpha=0.3)
    b.legend(fontsize=7, loc="lower left")
    if caption:
        fig.text(0.01, -0.02, caption, ha="left", va="top", fontsize=7, color="0.3")
    return save(fig, out, "sinusoidal", formats)


def _bias_encoding(run: Run, name: str) -> tuple[encodings.Encoding | None, str]:
    """The encoding with the run's shape and, if it has parameters, the trained ones from seed 0's
    checkpoint. (None, reason) when a learned bias has no matching checkpoint."""
    cfg = run.data["run"]["config"]
    m, T = cfg["model"], cfg["train"]["train_len"]
    enc = encodings.build(name, d_model=m["d_model"], n_heads=m["n_heads"], train_len=T,
                          options=(m.get("encoding_options") or {}).get(name))
    if not any(True for _ in enc.parameters()):
        return enc, ""
    recs = sorted((r for r in run.data["records"] if r["encoding"] == name and r["status"] == "ok"),
                  key=lambda r: r["seed"])
    if not recs:
        return None, f"no ok {name!r} record"
    from posenc_bench.bench import checkpoint

    ckpt = checkpoint.checkpoint_dir(Path(run.path if Path(run.path).is_dir() else Path(run.path).parent), Row(name),
                                     recs[0]["seed"])
    key = checkpoint.cell_key_of(ckpt)
    if key is None:
        return None, f"its bias is learned and there is no checkpoint at {ckpt}"
    if key != recs[0].get("cell_key"):
        return None, f"the checkpoint at {ckpt} is from a different config than the results"
    try:
        enc.load_state_dict(checkpoint.encoding_state(ckpt))
    except checkpoint.CheckpointError as e:
        return None, str(e)
    return enc, ""


def plot_bias(run: Run, name: str, out: Path, formats: Sequence[str] = FORMATS, stem: str | None = None
              ) -> list[Path]:
    """An encoding's attention bias: head 0 over (query, key) up to the train length, and every head's bias
    against distance up to the longest eval length."""
    enc, reason = _bias_encoding(run, name)
    if enc is None:
        raise PlotError(f"cannot draw the {name} bias: {reason}")
    T = run.data["run"]["config"]["train"]["train_len"]
    longest = max(r["eval_len"] for r in run.data["records"])
    with torch.no_grad():
        pos = torch.arange(T)
        square = enc.bias(pos, pos)[0].float()  # (H, T, T)
        square = square.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("nan"))  # future keys
        far = torch.arange(longest)
        by_distance = enc.bias(far[-1:], far)[0, :, 0].float().flip(-1)  # (H, longest): distance 0, 1, ...
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1, 1.1]},
                             layout="constrained")
    im = a.imshow(square[0].numpy(), cmap="viridis", interpolation="nearest")
    a.set_xlabel("key position")
    a.set_ylabel("query position")
    a.set_title(f"{name} bias, head 0 (future keys blank)")
    fig.colorbar(im, ax=a)
    for h in range(by_distance.shape[0]):
        b.plot(by_distance[h].numpy(), label=f"head {h}", linewidth=1)
    b.axvline(T, color="0.5", linestyle=":", linewidth=1)
    b.annotate(f"train length {T}", (T, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
               textcoords="offset points", fontsize=8, color="0.4")
    b.set_xlabel("distance query - key (tokens)")
    b.set_ylabel("added attention logit")
    b.set_title(f"{name} bias against distance, every head")
    b.grid(True, alpha=0.3)
    b.legend(fontsize=7, ncol=2)
    add_caption(fig, [run])
    return save(fig, out, stem or f"bias-{name}", formats)


def plot_needle_heatmaps(result: dict, out: Path | str, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Multi-needle retrieval (``bench/eval/needles.py``'s result, needles.json): per row one figure,
    ``needles-<row>``, with a depth x length heat map of the share of needles retrieved for each variant (RULER's
    niah variants), n/a in grey, the counts written in each cell and the effective length in the title."""
    import re

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    T, variants, depths = result["train_len"], result["variants"], result["depths"]
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="0.85")
    paths = []
    for row in result["rows"]:
        lengths = sorted({r["length"] for r in row["records"]})
        size = (1.2 + 0.9 * len(lengths) * len(variants), 1.2 + 0.45 * len(depths))
        fig, axes = plt.subplots(1, len(variants), figsize=size, layout="constrained", squeeze=False)
        for a, v in zip(axes[0], variants):
            grid = torch.full((len(depths), len(lengths)), float("nan"))
            for r in row["records"]:
                if r["variant"] == v and r["status"] == "ok":
                    i, j = depths.index(r["depth"]), lengths.index(r["length"])
                    grid[i, j] = r["accuracy"]
                    a.text(j, i, f"{r['correct']}/{r['needles']}", ha="center", va="center", fontsize=7)
            im = a.imshow(grid.numpy(), cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
            a.set_xticks(range(len(lengths)), [f"{L / T:g}x\n{L}" for L in lengths], fontsize=7)
            a.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
            a.set_xlabel("prompt length")
            eff = row["effective_by_variant"].get(v)
            a.set_title(f"{v}: effective {'none' if eff is None else f'{eff / T:g}x'}", fontsize=9)
        axes[0][0].set_ylabel("needle depth")
        fig.colorbar(im, ax=axes[0].tolist(), label="needles retrieved", shrink=0.9)
        eff = row["effective_length"]
        said = "none" if eff is None else f"{eff} tokens, {eff / T:g}x"
        fig.suptitle(f"{row['row']}: multi-needle retrieval by depth and length (effective length {said} at >= "
                     f"{100 * result['threshold']:g}%)", fontsize=9)
        name = row["row"].split(" (")[0].split("/")[-1]  # hf:org/model+yarn -> model+yarn; ours: rope-yarn (path)
        stem = "needles-" + (re.sub(r"[^\w.+-]+", "-", name).strip("-") or "model")
        paths += save(fig, out, stem, formats)
    return paths


def plot_all(runs: Sequence[Run], out: Path | str, formats: Sequence[str] = FORMATS,
             log: Callable[[str], None] = print, rows: Optional[str] = None) -> list[Path]:
    """Every figure the runs support; figures that cannot be drawn are skipped with the reason logged.
    ``rows``: a selection of the runs' rows in ``run --encodings`` syntax (rope,alibi | -learned | all)."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise PlotError(f"unknown figure format(s) {', '.join(map(repr, bad)) or '(none)'}; valid: {', '.join(FORMATS)}")
    every = list(dict.fromkeys(r for run in runs for r in row_order(run.data)))
    chosen = None if rows is None else select_rows(rows, every, every)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = {kind_of(run).name for run in runs}
    kind = kinds.pop() if len(kinds) == 1 else "ppl"  # a task run: exact match against size
    paths = [p for m in metrics.of_kind(kind) if m.plot and m.held_by(r for run in runs for r in run.data["records"])
             for p in plot_ppl_vs_length(runs, out, formats, chosen, m.name)]
    for run in [r for r in runs if not is_task(r)]:  # a task's records have no loss by position
        suffix = f"-{run.label}" if run.label else ""
        paths += plot_loss_by_position(run, out, formats, stem=f"loss_by_position{suffix}", rows=chosen)
    first = runs[0].data["run"]
    longest = max(r["eval_len"] for r in runs[0].data["records"])
    names = [n for run in runs for n in _encodings_of(run)]
    if "sinusoidal" in names:
        paths += plot_sinusoidal(first["config"]["model"]["d_model"], longest, out, formats)
    for run in runs:
        suffix = f"-{run.label}" if run.label else ""
        for name in [n for n in _encodings_of(run) if encodings.get_class(n).has_bias]:
            try:
                paths += plot_bias(run, name, out, formats, stem=f"bias-{name}{suffix}")
            except PlotError as e:
                log(f"skipped: {e}")
    return paths
