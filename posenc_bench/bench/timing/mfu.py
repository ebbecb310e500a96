"""Model FLOPs utilisation (MFU): the FLOPs a training step of the model must do, over the time it took, over
what the device can do at that precision.

The FLOP count is the one the time estimate prices a step with (``bench/train/eta.token_flops``, one home): per
token of a window of T, a forward pass is 2 FLOPs per weight of the attention and MLP matrices and the LM head
(embeddings and norms not counted) plus causal attention, q.k and a.v over T / 2 keys on average
(2 x T x d_model a layer); a training step is 3 x the forward. For B sequences of T tokens that is
``6 x weights x B x T + 6 x n_layers x d_model x T^2 x B``, the textbook ``6 N D`` plus attention's
``12 x n_layers x d_model x T^2 / 2 x B`` (Kaplan et al. 2020, sec. 2.1; PaLM, Chowdhery et al. 2022, app. B).
The count is the model's, not the path's: an explicit bias or a per-pair RoPE fix does more arithmetic for the
same model and so reads as a lower MFU.

The device's peak comes from ``PEAK_TFLOPS``, NVIDIA's dense (no sparsity) figures for a few GPUs, matched
on ``torch.cuda.get_device_name``, or from an override (``posenc-bench time --peak-tflops``). fp32 is the
plain FP32 figure (torch leaves TF32 off for matrix products unless asked, and this package never asks); bf16
the tensor-core BF16 figure. The CPU has no MFU here: no table could say what a shared VM's cores can do.
"""

from __future__ import annotations

from typing import Optional

from posenc_bench.bench.train.eta import token_flops

# (substring of torch.cuda.get_device_name, what it is, dense TFLOP/s per precision): NVIDIA's data sheets.
# The more specific names first ("H100 PCIe" contains "H100", "A100" "A10", "L40S" "L40" and "L4").
PEAK_TFLOPS: list[tuple[str, str, dict[str, float]]] = [
    ("H100 PCIe", "NVIDIA H100 PCIe", {"fp32": 51.0, "bf16": 756.0}),
    ("H100 NVL", "NVIDIA H100 NVL", {"fp32": 60.0, "bf16": 835.0}),
    ("H100", "NVIDIA H100 SXM", {"fp32": 67.0, "bf16": 989.0}),
    ("GH200", "NVIDIA GH200", {"fp32": 67.0, "bf16": 989.0}),
    ("H200", "NVIDIA H200 SXM", {"fp32": 67.0, "bf16": 989.0}),
    ("A100", "NVIDIA A100", {"fp32": 19.5, "bf16": 312.0}),
    ("L40S", "NVIDIA L40S", {"fp32": 91.6, "bf16": 362.0}),
    ("L40", "NVIDIA L40", {"fp32": 90.5, "bf16": 181.0}),
    ("L4", "NVIDIA L4", {"fp32": 30.3, "bf16": 121.0}),
    ("A10", "NVIDIA A10", {"fp32": 31.2, "bf16": 125.0}),
]

FLOP_COUNT = ("3 x forward; forward per token of a window of T: 2 per weight (attention, MLP, LM head) + "
              "2 x T x d_model per layer (causal q.k and a.v), i.e. 6 N B T + 6 n_layers d_model T^2 B")


def step_flops(model, batch: int, length: int) -> float:
    """FLOPs of one training step (forward and backward) of ``model`` (a ModelConfig or the config's model
    section) on ``batch`` sequences of ``length`` tokens."""
    return 3.0 * batch * length * token_flops(model, length)


def peak_flops(gpu: Optional[str], precision: str, override_tflops: Optional[float] = None) -> tuple[Optional[float], str]:
    """The peak in FLOP/s of CUDA device ``gpu`` (its name) at ``precision`` and where it comes from: the
    override when given, else the table's entry; (None, why) on the CPU (``gpu`` None, override or not) and
    where there is neither (an unknown GPU, a precision the table has no figure for)."""
    if not gpu:
        return None, "no MFU on the CPU"
    if override_tflops is not None:
        return override_tflops * 1e12, f"given: {override_tflops:g} TFLOP/s"
    for key, what, peaks in PEAK_TFLOPS:
        if key.lower() in gpu.lower() and precision in peaks:
            return peaks[precision] * 1e12, f"{what} dense {precision}: {peaks[precision]:g} TFLOP/s (data sheet)"
    return None, f"no peak known for {gpu!r} at {precision}: give --peak-tflops"


def mfu(flops: float, seconds: float, peak: Optional[float]) -> Optional[float]:
    """The fraction of ``peak`` FLOP/s that ``flops`` done in ``seconds`` reach; None without a peak."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / peak
