"""Peak memory per encoding: the extra memory one eval forward of the default model takes at a multiple of its
train length (``posenc-bench time``'s "eval peak memory" rows: 4x the default run's 128, and 4x the timing's
train length for the bias encodings), and what one training step (forward and backward) takes (the
forward+backward rows' ``peak_mib``), each relative to the fused path.

On CUDA the allocator's peak above what was allocated before is exact and measured in this process. On the CPU
the only measure is the process's resident memory, so the forward runs in a fresh process whose large
allocations are mmap-ed (``MALLOC_MMAP_THRESHOLD_``: a freed tensor leaves the RSS), and the peak RSS (VmHWM,
reset through /proc/self/clear_refs) of a second call above the RSS before it is the figure; one process per
encoding for the eval rows, one for all the training steps (each measured after its own warm-up step).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.env import precision_dtype, process_memory, reset_peak_rss
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from posenc_bench.values import TRAIN_PRECISIONS

TRAIN_LEN, LENGTH = 128, 512  # the default run's train length, and 4x it
BATCH_TOKENS = 16384  # eval.batch_tokens: the default eval rows' batch is BATCH_TOKENS // LENGTH
DIMS = "d128 L4 H4"  # ModelConfig()'s width, depth and heads, for the rows' dims column

_SCRIPT = "import sys; from posenc_bench.bench.eval.memory import main; main(sys.argv[1])"


def build_model(name: str, explicit: bool, train_len: int, device: torch.device) -> DecoderLM:
    """The default model (``ModelConfig()``) with encoding ``name``; ``explicit``: with a learned or folded bias
    taken as the straightforward (1, H, q, k) bias mask through SDPA instead of its own path."""
    model = DecoderLM(ModelConfig(), name, train_len, seed=0).to(device)
    if explicit:
        bias_as_mask(model.encoding)
    return model


def bias_as_mask(encoding) -> None:
    """Send ``encoding``'s bias through SDPA as the straightforward (1, H, q, k) float mask on every device and
    in training too: no folding into q/k channels, no FlexAttention, no bias kernel (the "explicit bias" rows of
    ``posenc-bench time``, the reference its own paths are measured against)."""
    encoding.has_low_rank_bias = encoding.has_score_mod = encoding.bias_kernel = False


def step_loss(model, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``model`` on ``batch`` (B, T + 1): the loss a timed training step
    backpropagates (a DecoderLM returns logits, a transformers model an output with ``.logits``)."""
    out = model(batch[:, :-1])
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def _peak_of(call: Callable[[], object], device: torch.device) -> Optional[int]:
    """Extra peak memory of ``call`` (run once before, untimed, for workspaces and caches) in bytes; None on a
    CPU without a way to reset the peak RSS."""
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    gc.collect()
    if not reset_peak_rss():  # the peak RSS (VmHWM) is now the current RSS
        return None
    before = process_memory("VmRSS")
    call()
    return max(0, process_memory("VmHWM") - before)


def measure_peaks(spec: dict, device: torch.device) -> list[Optional[int]]:
    """In this process: for each [name, explicit] of ``spec["jobs"]``, the extra peak of one eval forward of
    ``spec["batch"]`` x ``spec["length"]`` tokens (the model trained at ``spec["train_len"]``), or with
    ``spec["train"]`` of one forward+backward of ``batch`` x ``train_len`` tokens, under the autocast of
    ``spec["precision"]``."""
    dtype = precision_dtype(spec.get("precision", "fp32"), TRAIN_PRECISIONS)
    peaks = []

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    for name, explicit in spec["jobs"]:
        model = build_model(name, explicit, spec["train_len"], device)
        torch.manual_seed(0)
        if spec["train"]:
            x = torch.randint(0, 256, (spec["batch"], spec["train_len"] + 1), device=device)

            def call(model=model, x=x):
                with autocast():
                    loss = step_loss(model, x)
                loss.backward()
                model.zero_grad(set_to_none=True)
        else:
            model.eval().encoding.set_eval_length(spec["length"])
            x = torch.randint(0, 256, (spec["batch"], spec["length"]), device=device)

            def call(model=model, x=x):
                with torch.inference_mode(), autocast():
                    model(x)
        peaks.append(_peak_of(call, device))
        del model, x, call
    return peaks


def main(spec_json: str) -> None:
    """The fresh process's side (``_SCRIPT``): measure ``spec_json``'s peaks on the CPU and print them as JSON."""
    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    print(json.dumps({"peaks": measure_peaks(spec, torch.device("cpu"))}))


def _peaks(spec: dict, device: torch.device) -> list[Optional[int]]:
    """``measure_peaks`` here on CUDA; on the CPU in a fresh process (None for each where the peak RSS cannot
    be reset)."""
    if device.type == "cuda":
        return measure_peaks(spec, device)
    if not Path("/proc/self/clear_refs").exists():
        return [None] * len(spec["jobs"])
    # the folder that holds this posenc_bench package (not the package itself: its encodings/ would shadow
    # the standard library's and the interpreter would not start)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")]))}
    spec = {**spec, "threads": torch.get_num_threads()}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(spec)], capture_output=True, text=True, env=env)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        names = ", ".join(repr(name) for name, _ in spec["jobs"])
        raise RuntimeError(f"the peak-memory {'step' if spec['train'] else 'forward'} of {names} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peaks"]


def eval_peak_memory(name: str, device: torch.device, train_len: int, length: int, batch: int,
                     precision: str = "fp32") -> Optional[int]:
    """Extra memory of one eval forward of the default model at ``length`` (see the module docstring); None
    where the peak cannot be measured."""
    spec = {"jobs": [[name, False]], "train_len": train_len, "length": length, "batch": batch, "train": False,
            "precision": precision}
    return _peaks(spec, device)[0]


def train_peak_memory(jobs: list[tuple[str, bool]], device: torch.device, train_len: int, batch: int,
                      precision: str = "fp32") -> list[Optional[int]]:
    """Extra memory of one training forward+backward of the default model per (name, explicit bias) of
    ``jobs``, ``batch`` x ``train_len`` tokens (see the module docstring); None where it cannot be measured."""
    spec = {"jobs": [list(j) for j in jobs], "train_len": train_len, "length": train_len, "batch": batch,
            "train": True, "precision": precision}
    return _peaks(spec, device)


def memory_rows(device: torch.device, names: list[str], reference: str, log: Callable[[str], None], *,
                train_len: int = TRAIN_LEN, length: int = LENGTH, batch: Optional[int] = None,
                precision: str = "fp32") -> list[dict]:
    """Eval forward at ``length`` of the default model trained at ``train_len`` (default 128 -> 512, a batch of
    eval.batch_tokens=16384 tokens): peak extra memory of each of ``names`` and its ratio to ``reference``'s
    (the fused path, nope), which is measured first; no rows where the peak cannot be measured."""
    batch = batch or max(1, BATCH_TOKENS // length)
    rows, base = [], None
    for name in sorted(names, key=lambda n: n != reference):
        if why := encodings.out_of_range(name, train_len, length):
            log(f"  memory {name:<12} L={length:<6} n/a: {why}")
            continue
        peak = eval_peak_memory(name, device, train_len, length, batch, precision)
        if peak is None:
            return []
        base = peak if name == reference else base
        ratio = peak / base if base else None
        rows.append({"part": "eval peak memory", "encoding": name, "what": f"forward at {length / train_len:g}x, batch {batch}",
                     "length": length, "dims": DIMS, "median_s": None, "iqr_s": None, "runs": 1,
                     "peak_mib": round(peak / 2**20, 1), "x_fused": ratio})
        log(f"  memory {name:<12} L={length:<6} peak +{peak / 2**20:8.1f} MiB  x{ratio or float('nan'):.2f} fused")
    return rows
