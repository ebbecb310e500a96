"""Eval peak memory per encoding: the extra memory one eval forward of the default model takes at 4x its train
length, relative to the fused path (``posenc-bench time``'s "eval peak memory" rows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import torch

from posenc_bench.model.transformer import DecoderLM, ModelConfig

TRAIN_LEN, LENGTH = 128, 512  # the default run's train length, and 4x it

_PEAK_SCRIPT = r"""
import gc, json, sys, torch
from posenc_bench.env import process_memory, reset_peak_rss
from posenc_bench.model.transformer import DecoderLM, ModelConfig
name, train_len, length, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
model = DecoderLM(ModelConfig(), name, train_len, seed=0).eval()
model.encoding.set_eval_length(length)
x = torch.randint(0, 256, (batch, length))
with torch.inference_mode():
    model(x)  # warm-up at full size: workspaces, caches
    gc.collect()
    reset_peak_rss()  # the peak RSS (VmHWM) is now the current RSS
    before = process_memory("VmRSS")
    model(x)
    peak = process_memory("VmHWM")
print(json.dumps({"peak_extra_bytes": max(0, peak - before)}))
"""


def eval_peak_memory(name: str, device: torch.device, train_len: int, length: int, batch: int) -> Optional[int]:
    """Extra memory of one eval forward of the default model at ``length``: on CUDA the allocator's peak
    above what was allocated before; on CPU, in a fresh process whose large allocations are mmap-ed (so a
    freed tensor leaves the RSS), the peak RSS of the second forward above the RSS before it (Linux: the
    peak is reset through /proc/self/clear_refs; None where that is missing)."""
    if device.type == "cuda":
        model = DecoderLM(ModelConfig(), name, train_len, seed=0).to(device).eval()
        model.encoding.set_eval_length(length)
        x = torch.randint(0, 256, (batch, length), device=device)
        with torch.inference_mode():
            model(x[:, :8])
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            model(x)
            torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if not Path("/proc/self/clear_refs").exists():
        return None
    # the folder that holds this posenc_bench package (not the package itself: its encodings/ would shadow
    # the standard library's and the interpreter would not start)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, name, str(train_len), str(length), str(batch),
                           str(torch.get_num_threads())], capture_output=True, text=True, env=env)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the peak-memory forward of {name!r} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


def memory_rows(device: torch.device, names: list[str], reference: str, log: Callable[[str], None]) -> list[dict]:
    """Eval forward at 4x the train length (TRAIN_LEN -> LENGTH, a batch of eval.batch_tokens=16384 tokens):
    peak extra memory of each of ``names`` and its ratio to ``reference``'s (the fused path, nope), which is
    measured first; no rows where the peak cannot be measured."""
    batch = 16384 // LENGTH
    rows, base = [], None
    for name in sorted(names, key=lambda n: n != reference):
        peak = eval_peak_memory(name, device, TRAIN_LEN, LENGTH, batch)
        if peak is None:
            return []
        base = peak if name == reference else base
        ratio = peak / base if base else None
        rows.append({"part": "eval peak memory", "encoding": name, "what": f"forward at 4x, batch {batch}",
                     "length": LENGTH, "dims": "d128 L4 H4", "median_s": None, "iqr_s": None, "runs": 1,
                     "peak_mib": round(peak / 2**20, 1), "x_fused": ratio})
        log(f"  memory {name:<12} L={LENGTH:<6} peak +{peak / 2**20:8.1f} MiB  x{ratio or float('nan'):.2f} fused")
    return rows
