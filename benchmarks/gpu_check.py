"""The GPU check: every measurement a lent GPU should make, in one folder, resumable, within one 9-minute call.

Two modes, each a list of parts run in order; a part is skipped when its output is already in the folder, and
written atomically when it finishes (a ``time`` table into a temporary folder renamed into place; a training
run into its own results folder, which ``posenc-bench run`` itself resumes cell by cell, then a summary JSON
written last), so a call cut by its time limit is resumed by the same command:

``measure`` (about 4-5 minutes on an H100 or H200):
  - ``time-fp32/``, ``time-bf16/``: ``posenc-bench time`` at 2048 and 8192 tokens: one attention layer per
    encoding against the fused path (the bias rows and rope's zero-shot fixes, ReRoPE, Leaky ReRoPE,
    Self-Extend and sinks, among them), the forward+backward of the default model at 2048 with its peak memory
    and MFU, and the bias encodings' eval peak memory at 8192 (trained at 2048, batch 1). To fit the call:
    the trained encodings without their ``+rand`` variants (the same attention), and neither the generation
    part (launch-bound on a GPU, measured in results/timing-gpu), the Llama comparison, nor the eval memory at
    4x 128 (the CPU's figures stand);
  - ``long-2048/`` and ``long-2048.json``: ``configs/long-2048.yaml`` trained ``--long-steps`` steps (200) for
    nope, rope, alibi and t5, evaluated at 1x, with each row's tokens/s and MFU (the run's FLOP count,
    ``bench/timing/mfu.step_flops``, against the device's peak at the config's precision).

``train``: the comparison at 2048 on the GPU, ``configs/long-2048.yaml`` for ``--steps`` steps (1000) a row:
  nope, rope, alibi, t5, sinusoidal, kerple-power, xpos and xpos+bca (the xpos model evaluated with blockwise
  causal attention, no training of its own), at the config's eval lengths (1x to 4x) -> ``train-2048/`` and
  ``train-2048.json``.

``--tiny`` runs both on the CPU at a tiny size (a few seconds a part) to check the script, not the numbers.
Run from the repository root with the package importable, e.g. ``PYTHONPATH=. python benchmarks/gpu_check.py
measure --device cuda --out /tmp/gpu-check`` (docs/timing.md has the device commands).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from posenc_bench.bench.rows import Row
from posenc_bench.bench.timing import mfu
from posenc_bench.commands.cli import main as posenc_bench
from posenc_bench.files import atomic_write_json, atomic_write_text
from posenc_bench.model.transformer import ModelConfig

TIMED = "nope,sinusoidal,learned,rope,rope-partial,xpos,t5,alibi,kerple,kerple-power,fire,cope"
LONG_ROWS = "nope,rope,alibi,t5"
TRAIN_ROWS = "nope,rope,alibi,t5,sinusoidal,kerple-power,xpos,xpos+bca"
# --tiny: the same parts on the CPU at a size that takes seconds (fewer rows: each bias row's eval peak memory
# is a fresh process there)
TINY_TIME = ["--lengths", "64,128", "--d-model", "32", "--head-dim", "16", "--train-len", "32", "--train-tokens", "64",
             "--min-run-time", "0.001", "--train-min-run-time", "0.001", "--eval-len", "128", "--threads", "1",
             "--encodings", "nope,rope,alibi,t5"]
TINY_RUN = ["--precision", "fp32", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--train-len", "64",
            "--batch-size", "2", "--set", "train.warmup_steps=1", "--eval-tokens", "256", "--threads", "1",
            "--progress", "off"]


def time_part(out: Path, name: str, args: list[str]) -> str:
    """``posenc-bench time`` into ``out/name`` through a temporary folder renamed into place when it is done."""
    partial = out / f".partial-{name}"
    shutil.rmtree(partial, ignore_errors=True)
    if posenc_bench(["time", *args, "--out", str(partial)]) != 0:
        raise SystemExit(f"gpu_check: posenc-bench time for {name} failed; rerun to resume")
    partial.rename(out / name)
    rows = json.loads((out / name / "timing.json").read_text())["rows"]
    return f"{name} {len(rows)} rows"


def run_summary(folder: Path, peak_tflops: dict) -> dict:
    """Each row of a finished ``posenc-bench run`` folder: tokens/s in training (the run's own figure, the first,
    warming step included), model TFLOP/s and MFU by ``mfu.step_flops`` (against ``peak_tflops`` of the run's
    precision where given, else the GPU's in ``mfu.PEAK_TFLOPS``), and ppl at each eval length."""
    records = json.loads((folder / "results.json").read_text())["records"]
    rows: dict[str, dict] = {}
    for r in records:
        cfg = r["config"]
        model = ModelConfig(**{k: v for k, v in cfg["model"].items() if k in ModelConfig.__dataclass_fields__})
        T, B = cfg["train"]["train_len"], cfg["train"]["batch_size"]
        gpu = r["device"].split(":", 1)[1] if r["device"].startswith("cuda:") else None
        peak, source = mfu.peak_flops(gpu, cfg["precision"], peak_tflops.get(cfg["precision"]))
        row = rows.setdefault(r["encoding"], {"ppl": {}, "device": r["device"], "precision": cfg["precision"],
                                              "steps": cfg["train"]["steps"], "peak": source})
        row["ppl"][f"{r['ratio']:g}x"] = r.get("ppl")
        if Row.parse(r["encoding"]).eval_only:  # its model's training, counted on that row
            row["model"] = Row.parse(r["encoding"]).model.name
        elif r.get("train_tokens_per_s"):
            flops_s = r["train_tokens_per_s"] * mfu.step_flops(model, B, T) / (B * T)
            row.update(tokens_per_s=r["train_tokens_per_s"], tflops=flops_s / 1e12, mfu=mfu.mfu(flops_s, 1.0, peak),
                       train_time_s=r.get("train_time_s"))
    return rows


def run_part(out: Path, name: str, args: list[str], peak_tflops: dict) -> str:
    """``posenc-bench run`` into ``out/name`` (resumed cell by cell), then ``out/name.json``, its summary."""
    if posenc_bench(["run", "--config", "long-2048", *args, "--out", str(out / name)]) != 0:
        raise SystemExit(f"gpu_check: posenc-bench run for {name} failed; rerun to resume")
    rows = run_summary(out / name, peak_tflops)
    atomic_write_json(out / f"{name}.json", rows)
    for enc, r in rows.items():
        speed = "" if "tokens_per_s" not in r else (
            f"{r['tokens_per_s']:,.0f} tokens/s, {r['tflops']:.3g} TFLOP/s"
            + ("" if r["mfu"] is None else f", MFU {r['mfu']:.1%}"))
        print(f"{name} {enc}: {speed or 'the model of ' + r.get('model', '?') + ', evaluated'}; ppl "
              + ", ".join(f"{k} {v:.3f}" for k, v in r["ppl"].items() if v is not None))
    return f"{name} {len(rows)} rows"


def parts(args) -> list[tuple[str, Path, object]]:
    """(name, the file whose presence means done, what makes it) of the mode's parts, in order."""
    out, dev = Path(args.out), ["--device", "cpu" if args.tiny else args.device]
    given = {p: v for p, v in (("fp32", args.peak_tflops_fp32), ("bf16", args.peak_tflops_bf16)) if v is not None}
    peak = {p: [] if p not in given else ["--peak-tflops", str(given[p])] for p in ("fp32", "bf16")}
    if args.mode == "train":
        steps = ["--steps", str(3 if args.tiny else args.steps)]
        run = TINY_RUN + ["--eval-lens", "1x,2x"] if args.tiny else ["--eval-tokens", str(args.eval_tokens)]
        return [("train-2048", out / "train-2048.json", lambda: run_part(
            out, "train-2048", ["--encodings", args.rows or TRAIN_ROWS, *dev, *steps, *run], given))]
    timing = TINY_TIME if args.tiny else ["--lengths", "2048,8192", "--train-len", "2048", "--encodings", TIMED,
                                          "--min-run-time", "0.1", "--train-min-run-time", "0.3"]
    skip = ["--skip", "generation,llama,memory"]
    long_args = ["--encodings", args.rows or LONG_ROWS, *dev, "--steps", str(3 if args.tiny else args.long_steps),
                 "--eval-lens", "1x", *(TINY_RUN if args.tiny else ["--set", "train.warmup_steps=20",
                                                                    "--eval-tokens", "65536"])]
    return [(f"time-{p}", out / f"time-{p}" / "timing.json",
             lambda p=p: time_part(out, f"time-{p}", [*dev, "--precision", p, *timing, *skip, *peak[p]]))
            for p in ("fp32", "bf16")] + [
        ("long-2048", out / "long-2048.json", lambda: run_part(out, "long-2048", long_args, given))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["measure", "train"])
    p.add_argument("--device", default="cuda", help="cuda (default) | cuda:N | cpu")
    p.add_argument("--out", required=True, help="the one folder everything is written to (resumed when rerun)")
    p.add_argument("--tiny", action="store_true", help="everything on the CPU at a tiny size: checks the script")
    p.add_argument("--steps", type=int, default=1000, help="train: training steps a row (default 1000)")
    p.add_argument("--long-steps", type=int, default=200, help="measure: steps of the long-2048 rows (default 200)")
    p.add_argument("--eval-tokens", type=int, default=262144, help="train: tokens scored a length (default 262144)")
    p.add_argument("--rows", help=f"the rows trained (train: {TRAIN_ROWS}; measure's long-2048: {LONG_ROWS})")
    for precision in ("fp32", "bf16"):
        p.add_argument(f"--peak-tflops-{precision}", type=float, help=f"the GPU's peak TFLOP/s in {precision} for MFU "
                       "(default: the data-sheet table of bench/timing/mfu.py)")
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    start, ran, skipped = time.monotonic(), [], []
    for name, done, make in parts(args):
        if done.exists():
            skipped.append(name)
            continue
        t0 = time.monotonic()
        ran.append(f"{make()} in {time.monotonic() - t0:.0f} s")
    line = (f"gpu_check {args.mode}{' --tiny' if args.tiny else ''} on {'cpu' if args.tiny else args.device}: "
            f"ran {'; '.join(ran) or 'nothing'}; skipped (done) {', '.join(skipped) or 'nothing'}; "
            f"{time.monotonic() - start:.0f} s; -> {args.out}")
    atomic_write_text(Path(args.out) / f"summary-{args.mode}.txt", line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
