"""Figures from results files (matplotlib, headless): ppl against eval length, loss by position, and the
pictures people use to understand encodings (the sinusoidal table, ALiBi / T5 attention bias).

Numbers come from ``results.json`` alone. The encoding pictures are drawn by the encodings' own code with
the run's width, heads and train length; a learned bias (T5) is read from the run's checkpoint, and is
skipped, with the reason, when the checkpoint is not there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: no display needed, same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from posenc_bench import encodings  # noqa: E402
from posenc_bench.bench.config import parse_row  # noqa: E402
from posenc_bench.errors import PosencError  # noqa: E402
from posenc_bench.analysis.report import Run, short_caption  # noqa: E402

FORMATS = ("png", "svg")
LINESTYLES = ("-", "--", "-.")  # rows 0-9, 10-19, 20-29 of the ten default colours
DPI = 110


class PlotError(PosencError):
    pass


def _save(fig, out: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    paths = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        # no timestamps or random ids in the files, so regenerated figures only differ when the data does
        metadata = {"Date": None} if fmt == "svg" else {"Software": None}
        with matplotlib.rc_context({"svg.hashsalt": "posenc-bench"}):
            fig.savefig(path, dpi=DPI, metadata=metadata, bbox_inches="tight")
        paths.append(path)
    plt.close(fig)
    return paths


def _caption(fig, runs: Sequence[Run]) -> None:
    text = "\n".join((f"{r.label}: " if r.label else "") + short_caption(r.data["run"], r.data["records"])
                     for r in runs)
    fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=7, color="0.3")


def _mean_by_length(records: list[dict], row: str) -> list[tuple[int, float, float]]:
    """(eval length, mean ppl, std) over the seeds that are ok, for every length with at least one."""
    out = []
    for L in sorted({r["eval_len"] for r in records if r["encoding"] == row}):
        vals = [r["ppl"] for r in records if r["encoding"] == row and r["eval_len"] == L and r["status"] == "ok"]
        if vals:
            mean = sum(vals) / len(vals)
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
            out.append((L, mean, std))
    return out


def _rows(run: Run) -> list[str]:
    order = list(run.data["run"].get("rows") or [])
    return order + [r for r in dict.fromkeys(x["encoding"] for x in run.data["records"]) if r not in order]


def _train_len(run: Run) -> int:
    return run.data["run"].get("train_len") or run.data["run"]["config"]["train"]["train_len"]


def _encodings_of(run: Run) -> list[str]:
    """The registered encodings behind a run's rows (none for a pretrained model's rows)."""
    names = []
    for row in _rows(run):
        try:
            names.append(parse_row(row)[0])
        except PosencError:
            continue
    return list(dict.fromkeys(names))


def plot_ppl_vs_length(runs: Sequence[Run], out: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Perplexity against eval length, one line per encoding (per run), train lengths marked."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    all_means = []
    markers = "osD^v<>ph*"
    for i, run in enumerate(runs):
        style = ["-", "--", ":", "-."][i % 4]
        for j, row in enumerate(_rows(run)):
            pts = _mean_by_length(run.data["records"], row)
            if not pts:
                continue
            xs, ys, es = zip(*pts)
            all_means += ys
            label = f"{run.label}: {row}" if run.label else row
            if len(pts) < len({r["eval_len"] for r in run.data["records"]}):
                label += f" (to {xs[-1]})"
            ax.errorbar(xs, ys, yerr=es if any(es) else None, label=label,
                        linestyle=style if len(runs) > 1 else LINESTYLES[j // 10 % 3],
                        marker=markers[j % len(markers)], markersize=4, capsize=2, color=f"C{j % 10}")
    if not all_means:
        plt.close(fig)
        raise PlotError("no ok records to plot (every cell is n/a or diverged)")
    for T in sorted({r["train_len"] for run in runs for r in run.data["records"]}):
        ax.axvline(T, color="0.5", linestyle=":", linewidth=1)
        ax.annotate(f"train length {T}", (T, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=8, color="0.4")
    ax.set_xscale("log", base=2)
    lengths = sorted({r["eval_len"] for run in runs for r in run.data["records"]})
    ax.set_xticks(lengths, [str(L) for L in lengths])
    ax.minorticks_off()
    if max(all_means) / min(all_means) > 4:
        ax.set_yscale("log")
    ax.set_xlabel("eval length (tokens)")
    ax.set_ylabel("perplexity (per token, lower is better)")
    ax.set_title("Perplexity against eval length (same target tokens at every length)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _caption(fig, runs)
    return _save(fig, out, "ppl_vs_length", formats)


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


def plot_loss_by_position(run: Run, out: Path, formats: Sequence[str] = FORMATS, stem: str = "loss_by_position"
                          ) -> list[Path]:
    """Loss by position over the longest eval length, one line per encoding: where each encoding breaks."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    longest = max(r["eval_len"] for r in run.data["records"])
    drawn = 0
    for j, row in enumerate(_rows(run)):
        got = _loss_by_position(run.data["records"], row)
        if got is None:
            continue
        L, pts = got
        xs, ys = zip(*pts)
        label = row if L == longest else f"{row} (only to {L})"
        ax.plot(xs, ys, label=label, color=f"C{j % 10}", linestyle=LINESTYLES[j // 10 % 3], linewidth=1.3)
        drawn += 1
    if not drawn:
        plt.close(fig)
        raise PlotError(f"{run.path}: no record has a loss by position")
    T = _train_len(run)
    ax.axvline(T, color="0.5", linestyle=":", linewidth=1)
    ax.annotate(f"train length {T}", (T, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                textcoords="offset points", fontsize=8, color="0.4")
    ax.set_xlabel("position in the window (tokens)")
    ax.set_ylabel("mean loss (nats per token)")
    title = f"Loss by position at eval length {longest} ({longest / T:g}x the train length)"
    ax.set_title(title + (f" - {run.label}" if run.label else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _caption(fig, [run])
    return _save(fig, out, stem, formats)


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
    return _save(fig, out, "sinusoidal", formats)


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

    ckpt = checkpoint.checkpoint_dir(Path(run.path if Path(run.path).is_dir() else Path(run.path).parent), name, None,
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
    _caption(fig, [run])
    return _save(fig, out, stem or f"bias-{name}", formats)


def plot_all(runs: Sequence[Run], out: Path | str, formats: Sequence[str] = FORMATS,
             log: Callable[[str], None] = print) -> list[Path]:
    """Every figure the runs support; figures that cannot be drawn are skipped with the reason logged."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise PlotError(f"unknown figure format(s) {', '.join(map(repr, bad)) or '(none)'}; valid: {', '.join(FORMATS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = plot_ppl_vs_length(runs, out, formats)
    for run in runs:
        suffix = f"-{run.label}" if run.label else ""
        paths += plot_loss_by_position(run, out, formats, stem=f"loss_by_position{suffix}")
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
