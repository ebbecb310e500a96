import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

from posenc_bench.analysis import plots
from posenc_bench.analysis.runs import load_runs
from posenc_bench.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]


def copy_results(tmp_path: Path) -> Path:
    """The committed default results, without checkpoints (as in a fresh clone)."""
    folder = tmp_path / "default"
    folder.mkdir()
    shutil.copy(ROOT / "results" / "default" / "results.json", folder / "results.json")
    return folder


def assert_real_figure(path: Path, min_w: int = 700, min_h: int = 400) -> None:
    img = mpimg.imread(path)  # (H, W, 4) floats in [0, 1]
    h, w = img.shape[:2]
    assert w >= min_w and h >= min_h, (path.name, w, h)
    rgb = img[..., :3]
    ink = (rgb < 0.9).any(axis=-1).mean()  # share of pixels that are not (near) white
    assert ink > 0.03, f"{path.name} looks blank ({ink:.1%} ink)"
    assert len(np.unique((rgb * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 20, f"{path.name}: too few colours"


def test_plot_cli_draws_every_figure_and_skips_a_learned_bias_without_checkpoint(tmp_path, capsys):
    folder = copy_results(tmp_path)
    out = tmp_path / "figs"
    assert main(["plot", str(folder), "--out", str(out), "--formats", "png"]) == 0
    printed = capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["bias-alibi.png", "loss_by_position.png", "ppl_vs_length.png", "ratio_vs_length.png",
                     "sinusoidal.png"]
    assert "skipped: cannot draw the t5 bias: its bias is learned and there is no checkpoint at" in printed
    for p in out.iterdir():
        assert_real_figure(p)


def test_svg_output_is_deterministic(tmp_path):
    runs = load_runs([copy_results(tmp_path)])
    a = plots.plot_ppl_vs_length(runs, tmp_path, formats=["svg"])[0].read_bytes()
    b = plots.plot_ppl_vs_length(runs, tmp_path, formats=["svg"])[0].read_bytes()
    assert a == b and b"Perplexity against eval length" in a and b"train length 128" in a


def test_learned_bias_comes_from_the_runs_checkpoint(tmp_path):
    from safetensors.torch import save_file

    folder = copy_results(tmp_path)
    data = json.loads((folder / "results.json").read_text())
    key = next(r["cell_key"] for r in data["records"] if r["encoding"] == "t5" and r["seed"] == 0)
    ckpt = folder / "checkpoints" / "t5-seed0"
    ckpt.mkdir(parents=True)
    weight = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4) / 100  # (buckets, heads)
    save_file({"encoding.relative_attention_bias.weight": weight, "blocks.0.x": torch.zeros(1)},
              str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps({"cell_key": key}))
    run = load_runs([folder])[0]
    enc, reason = plots._bias_encoding(run, "t5")
    assert reason == "" and torch.equal(enc.relative_attention_bias.weight, weight)
    bias = enc.bias(torch.tensor([5]), torch.tensor([5, 4]))  # distance 0 -> bucket 0, distance 1 -> bucket 1
    assert torch.equal(bias[0, :, 0], weight[[0, 1]].T)
    paths = plots.plot_bias(run, "t5", tmp_path, formats=["png"])
    assert_real_figure(paths[0])
    (ckpt / "config.json").write_text(json.dumps({"cell_key": "other"}))
    with pytest.raises(plots.PlotError, match="from a different config than the results"):
        plots.plot_bias(run, "t5", tmp_path, formats=["png"])


def test_families_get_their_own_panels_without_a_hand_kept_list():
    rows = load_runs([ROOT / "results" / "default"])[0].data["run"]["rows"]
    got = {title: (mine, refs) for title, mine, refs in plots.panels(rows)}
    assert list(got) == ["classic encodings", "RoPE, zero-shot scalings and fixes", "RoPE, fine-tuned"]
    assert got["classic encodings"][0] == ["sinusoidal", "learned", "t5", "rope", "alibi", "nope"]
    assert got["RoPE, zero-shot scalings and fixes"] == (["rope-linear", "rope-ntk", "rope-dynamic", "rope-yarn",
                                                          "rope-llama3"], ["rope"])
    assert got["RoPE, fine-tuned"][0][0] == "rope-ft" and got["RoPE, fine-tuned"][1] == ["rope"]
    assert plots.panels(["hf:SmolLM2+linear"]) == [("pretrained models", ["hf:SmolLM2+linear"], [])]
    # the full sweep: the newer trained encodings, the zero-shot fixes and the +rand rows each find their panel
    full = load_runs([ROOT / "results" / "full"])[0].data["run"]["rows"]
    got = {title: (mine, refs) for title, mine, refs in plots.panels(full)}
    assert list(got) == ["classic encodings", "newer encodings", "RoPE, zero-shot scalings and fixes",
                         "randomized positions"]
    assert got["classic encodings"][0] == ["sinusoidal", "learned", "t5", "rope", "alibi", "nope"]
    assert set(got["newer encodings"][0]) == {"rope-partial", "xpos", "xpos+bca", "kerple", "kerple-power", "fire",
                                              "cope"}
    assert {"rope-rerope", "rope-leaky", "rope-selfextend", "rope+sink4+sw124", "rope-yarn"} <= set(
        got["RoPE, zero-shot scalings and fixes"][0]) and got["RoPE, zero-shot scalings and fixes"][1] == ["rope"]
    assert all(r.endswith("+rand") for r in got["randomized positions"][0]) and len(got["randomized positions"][0]) == 5


def test_no_two_rows_of_a_panel_share_colour_and_marker(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, out, stem, formats: figures.append(fig) or [])
    runs = load_runs([ROOT / "results" / "default"])
    plots.plot_ppl_vs_length(runs, tmp_path)
    plots.plot_loss_by_position(runs[0], tmp_path)
    assert len({len(s) for s in (plots.style(i) for i in range(100))}) == 1
    assert len({tuple(plots.style(i).values()) for i in range(100)}) == 100
    for fig in figures:
        for ax in [a for a in fig.axes if a.get_visible()]:
            handles, labels = ax.get_legend_handles_labels()
            looks = []
            for h in handles:
                line = h.lines[0] if hasattr(h, "lines") else h
                looks.append((str(line.get_color()), line.get_marker(), line.get_linestyle()))
            assert len(set(looks)) == len(looks) and len(labels) >= 2, (ax.get_title(), labels)


def test_plot_rows_selects_like_run_encodings(tmp_path, capsys):
    folder = copy_results(tmp_path)
    assert main(["plot", str(folder), "--out", str(tmp_path / "f"), "--formats", "png", "--rows",
                 "rope,rope-yarn,alibi"]) == 0
    assert_real_figure(tmp_path / "f" / "ppl_vs_length.png")
    from posenc_bench.bench.rows import select_rows

    rows = ["rope", "rope-linear", "alibi", "rope+sw64"]
    assert select_rows("-rope", rows, rows) == ["rope-linear", "alibi"]
    assert select_rows("all,-alibi", rows, rows) == ["rope", "rope-linear", "rope+sw64"]
    capsys.readouterr()
    assert main(["plot", str(folder), "--out", str(tmp_path / "g"), "--rows", "rope,ropey"]) == 2
    err = capsys.readouterr().err
    assert "row 'ropey' is not in the results; rows: sinusoidal, learned" in err and err.count("\n") == 1


def test_each_row_with_an_interval_gets_a_band_that_spans_it(tmp_path, monkeypatch):
    from matplotlib.collections import PolyCollection

    from posenc_bench.analysis.stats.intervals import Intervals

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, out, stem, formats: figures.append(fig) or [])
    runs = load_runs([ROOT / "results" / "default"])
    plots.plot_ppl_vs_length(runs, tmp_path, rows=["rope", "alibi", "learned"])
    ax = next(a for a in figures[0].axes if a.get_visible())
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # rope and alibi; learned has one length (a bar, not a band)
    iv = Intervals(runs[0].data["records"])
    for band, row in zip(bands, ["rope", "alibi"]):
        verts = band.get_paths()[0].vertices
        for L in (128, 192, 256, 512):
            i = iv.interval("ppl", row, L)
            ys = verts[np.isclose(verts[:, 0], L), 1]
            assert np.isclose(ys.min(), i.lo) and np.isclose(ys.max(), i.hi), (row, L, ys, i)
    assert "Bands: each row's own 95% interval, unpaired" in figures[0]._suptitle.get_text()
    # the ratio figure draws the paired interval of each row's ratio to its own 1x: the ratio table's
    plots.plot_ppl_vs_length(runs, tmp_path, rows=["rope", "alibi"], value="ratio")
    ax = next(a for a in figures[1].axes if a.get_visible())
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    for band, row in zip(bands, ["rope", "alibi"]):
        verts = band.get_paths()[0].vertices
        i = iv.interval("ratio", row, 512)
        ys = verts[np.isclose(verts[:, 0], 512), 1]
        assert np.isclose(ys.min(), i.lo) and np.isclose(ys.max(), i.hi), (row, ys, i)
        assert (i.lo > 1) if row == "rope" else (i.hi < 1)  # rope degrades at 4x, alibi improves
    assert "the paired 95% interval of each row's" in figures[1]._suptitle.get_text()


def test_without_intervals_a_line_is_the_mean_over_ok_seeds_with_its_std():
    def rec(seed, L, ppl, status="ok"):
        return {"encoding": "rope", "seed": seed, "train_len": 100, "eval_len": L, "status": status, "ppl": ppl}

    recs = [rec(0, 100, 4.0), rec(1, 100, 6.0), rec(0, 200, 8.0), rec(1, 200, None, "diverged"),
            rec(0, 400, None, "n/a")]
    pts = plots._mean_by_length(recs, "rope")
    assert pts[0][:2] == (100, 5.0) and pts[0][2] == pts[0][3] == pytest.approx(2 ** 0.5)
    assert pts[1] == (200, 8.0, 0.0, 0.0) and len(pts) == 2  # one ok seed: no spread; no ok seed: no point


def test_longppl_is_drawn_where_the_records_hold_key_tokens_and_nowhere_else(tmp_path, monkeypatch):
    """LongPPL's figure: a folder whose records past 1x carry key-token sums gets longppl_vs_length, its lines at
    the lengths past 1x at the LongPPL of those sums (one seed here: exp(sum key_nll / sum key_tokens)); the
    default folder, without key tokens, gets none (test_plot_cli_draws_every_figure...)."""
    data = json.loads((ROOT / "results" / "default" / "results.json").read_text())
    data["records"] = [r for r in data["records"] if r["seed"] == 0 and r["encoding"] in ("rope", "alibi")]
    for r in data["records"]:
        if r["status"] == "ok" and r["ratio"] > 1:  # a made-up key set: every 8th unit's NLL, at a tenth the count
            r["units"]["key_nll"] = [v if i % 8 == 0 else 0.0 for i, v in enumerate(r["units"]["nll"])]
            r["units"]["key_tokens"] = [t // 10 if i % 8 == 0 else 0 for i, t in enumerate(r["units"]["tokens"])]
    folder = tmp_path / "keys"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(data))
    out = tmp_path / "figs"
    assert main(["plot", str(folder), "--out", str(out), "--formats", "png"]) == 0
    assert_real_figure(out / "longppl_vs_length.png")
    lines = []
    monkeypatch.setattr(plots, "_line_with_band", lambda ax, xs, ys, below, above, label, look: lines.append((label, xs, ys)))
    plots.plot_ppl_vs_length(load_runs([folder]), tmp_path, formats=["png"], value="longppl")
    assert {label for label, _, _ in lines} == {"rope", "alibi"}
    for label, xs, ys in lines:
        assert xs == (192, 256, 512)  # not at 1x: no key tokens there
        for L, y in zip(xs, ys):
            u = next(r for r in data["records"] if r["encoding"] == label and r["eval_len"] == L)["units"]
            assert y == pytest.approx(np.exp(sum(u["key_nll"]) / sum(u["key_tokens"])), rel=1e-9)
