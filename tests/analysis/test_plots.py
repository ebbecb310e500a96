import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

from posenc_bench.analysis import plots
from posenc_bench.analysis import report
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
    assert names == ["bias-alibi.png", "loss_by_position.png", "ppl_vs_length.png", "sinusoidal.png"]
    assert "skipped: cannot draw the t5 bias: its bias is learned and there is no checkpoint at" in printed
    for p in out.iterdir():
        assert_real_figure(p)


def test_svg_output_is_deterministic(tmp_path):
    runs = report.load_runs([copy_results(tmp_path)])
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
    run = report.load_runs([folder])[0]
    enc, reason = plots._bias_encoding(run, "t5")
    assert reason == "" and torch.equal(enc.relative_attention_bias.weight, weight)
    bias = enc.bias(torch.tensor([5]), torch.tensor([5, 4]))  # distance 0 -> bucket 0, distance 1 -> bucket 1
    assert torch.equal(bias[0, :, 0], weight[[0, 1]].T)
    paths = plots.plot_bias(run, "t5", tmp_path, formats=["png"])
    assert_real_figure(paths[0])
    (ckpt / "config.json").write_text(json.dumps({"cell_key": "other"}))
    with pytest.raises(plots.PlotError, match="from a different config than the results"):
        plots.plot_bias(run, "t5", tmp_path, formats=["png"])
