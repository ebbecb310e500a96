"""``posenc-bench time``'s training part: a forward+backward of the default model per trained encoding against
the fused path, with its peak memory and, on CUDA, its model FLOPs utilisation; and a training step of our
RoPE model against transformers' ``LlamaForCausalLM`` of the same size.

The step runs under the run's precision (``--precision bf16``: autocast, as ``posenc-bench run`` trains); its
peak memory comes from ``bench/eval/memory.train_peak_memory`` (the allocator's peak on CUDA, a fresh process's
peak RSS on the CPU) and its FLOP count and MFU from ``mfu.py``.
"""

from __future__ import annotations

from typing import Optional

import torch

from posenc_bench.bench.eval import memory as eval_memory
from posenc_bench.bench.eval.memory import build_model, step_loss
from posenc_bench.bench.timing import mfu
from posenc_bench.bench.timing.measure import FUSED, alternate_rounds, median, versus_fused
from posenc_bench.bench.timing.references import llama_like
from posenc_bench.env import precision_dtype
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from posenc_bench.values import TRAIN_PRECISIONS

EXPLICIT = " (explicit bias)"  # a row's label suffix when its bias goes through SDPA as a (1, H, q, k) mask


def training_jobs(names: list[str]) -> list[tuple[str, bool]]:
    """(encoding, explicit bias) of each forward+backward row: ``names`` (the fused path first), then alibi and
    t5 through a (1, H, q, k) bias mask where they are among them."""
    return [(n, False) for n in names] + [(n, True) for n in ("alibi", "t5") if n in names]


def training_rows(tc, device: torch.device, log, names: list[str], peak_flops: Optional[float] = None,
                  rounds: int = 5) -> list[dict]:
    """Forward+backward of configs/default.yaml's model at tc.train_len per encoding of ``names`` (the fused
    path first), vs nope (fused), with its peak memory (``peak_mib``, ``peak_x_fused``), tokens/s, TFLOP/s by
    ``mfu.step_flops`` and, given the device's ``peak_flops``, its MFU.

    The variants are measured in turn, ``rounds`` times; each round's ratio is taken against that round's
    fused time and the median ratio reported with all of them (a shared machine drifts between rounds; the
    bias and CoPE rows, whose steps allocate the most, drift the most: hence five rounds, not three)."""
    T = tc.train_len
    B = max(1, tc.train_tokens // T)
    dtype = precision_dtype(tc.precision, TRAIN_PRECISIONS)
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (B, T + 1), device=device)
    jobs = training_jobs(names)
    steps = {}
    for name, explicit in jobs:
        model = build_model(name, explicit, T, device)

        def step(model=model):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = step_loss(model, batch)
            loss.backward()
            model.zero_grad(set_to_none=True)

        steps[name + (EXPLICIT if explicit else "")] = step
    timings, ratios = alternate_rounds(steps, FUSED, rounds=rounds, min_run_time=max(tc.min_run_time, tc.train_min_run_time))
    del steps  # the models: the peaks below are measured one model at a time
    peaks = eval_memory.train_peak_memory(jobs, device, T, B, tc.precision)
    flops = mfu.step_flops(ModelConfig(), B, T)
    rows = []
    for (label, ts), peak in zip(timings.items(), peaks):
        fused, words = versus_fused(ts, ratios[label])
        seconds = median([t["median_s"] for t in ts])
        use = mfu.mfu(flops, seconds, peak_flops)
        rows.append({"part": "model forward+backward", "encoding": label, "what": f"batch {B}, {rounds} rounds",
                     "length": T, "dims": eval_memory.DIMS, "median_s": seconds, "iqr_s": None, "runs": rounds, **fused,
                     "peak_mib": None if peak is None else round(peak / 2**20, 1),
                     "peak_x_fused": None if peak is None or not peaks[0] else peak / peaks[0],
                     "tokens_per_s": B * T / seconds, "step_flops": flops, "tflops": flops / seconds / 1e12, "mfu": use})
        log(f"  train {label:<24} T={T:<6} {seconds * 1e3:9.1f} ms  {words}"
            + ("" if peak is None else f"  peak +{peak / 2**20:.1f} MiB") + ("" if use is None else f"  MFU {use:.1%}"))
    return rows


def versus_llama(device: torch.device, log, *, train_len: int = 128, batch: int = 32, rounds: int = 9,
                 min_run_time: float = 0.5) -> dict:
    """Training step (forward, backward, AdamW) of our RoPE model vs transformers' LlamaForCausalLM of the
    same size, at the default run's shape; alternated ``rounds`` times (each after one untimed step), the
    ratio of each pair reported."""
    cfg = ModelConfig()
    ours = DecoderLM(cfg, "rope", train_len, seed=0).to(device)
    llama = llama_like(cfg, train_len).to(device)
    torch.manual_seed(0)
    data = torch.randint(0, 256, (batch, train_len + 1), device=device)

    def stepper(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            step_loss(model, data).backward()
            opt.step()

        return step

    steps = {"ours": stepper(ours), "llama": stepper(llama)}
    for step in steps.values():  # AdamW's state and first-call allocations stay out of the rounds
        step()
    timings, per_round = alternate_rounds(steps, "ours", rounds=rounds, min_run_time=min_run_time)
    ratios = per_round["llama"]  # Llama's time / ours = our tokens/s / Llama's
    times = {k: [t["median_s"] for t in ts] for k, ts in timings.items()}
    tokens = batch * train_len
    result = {
        "shape": f"batch {batch} x {train_len} tokens", "params_ours": sum(p.numel() for p in ours.parameters()),
        "params_llama": sum(p.numel() for p in llama.parameters()),
        "ours_tokens_per_s": [tokens / t for t in times["ours"]], "llama_tokens_per_s": [tokens / t for t in times["llama"]],
        "ratio": median(ratios), "ratios": ratios,
        "note": "ours: LayerNorm, 4x GELU MLP; Llama: RMSNorm, SwiGLU with 8/3x inner size (same parameters +-0.2%)",
    }
    log(f"  training tokens/s at {result['shape']}, our rope model / LlamaForCausalLM ({result['params_ours']:,} vs "
        f"{result['params_llama']:,} parameters): {result['ratio']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    return result
