"""What each encoding costs: generation against the machine's floor, application against the fused path.

Everything is timed with ``torch.utils.benchmark.Timer.blocked_autorange`` (warm-up, many repeats, median
and IQR; CUDA synchronised by the Timer, so device time is measured). All ratios compare numbers measured in
the same run.

- Generation, per length L: what the encoding builds for L positions (the sinusoidal table, the RoPE cos/sin
  cache, ALiBi's folded bias factors or its full bias, the T5 bias, the learned table lookup), next to
  * the floor: the larger of writing the output bytes and evaluating one float32 sin per distinct
    transcendental value a direct evaluation needs (``x_floor``), both timed here;
  * the textbook version (torch.zeros + strided sin/cos assignment) for sinusoidal and transformers'
    ``LlamaRotaryEmbedding`` for RoPE (``x_textbook``: reference time / ours, > 1 means ours is faster).
- Application, per length: one attention layer's forward with the encoding (``x_fused``: time / the same layer
  on the fused causal path, i.e. ``nope``), and per trained encoding a forward+backward of the small model at
  ``train_len`` (also ``x_fused``).
- Training throughput of our RoPE model against transformers' ``LlamaForCausalLM`` of the same size.
"""

from __future__ import annotations

import csv
import io
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from posenc_bench import encodings
from posenc_bench.errors import ConfigError
from posenc_bench.model.attention import AttentionPlan
from posenc_bench.model.transformer import CausalSelfAttention, DecoderLM, ModelConfig
from posenc_bench.files import atomic_write_json, atomic_write_text

PRECISIONS = ("fp32", "bf16")  # of posenc_bench.env.PRECISIONS: the attention layers' dtype


@dataclass
class TimingConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    lengths: list = field(default_factory=lambda: [2048, 5000, 8192])
    d_model: int = 512  # width of the sinusoidal / learned tables and of the attention layer
    head_dim: int = 128  # RoPE cache width; the attention layer has d_model / head_dim heads
    precision: str = "fp32"  # fp32 | bf16: the attention layers (posenc-bench time --precision)
    threads: Optional[int] = None
    min_run_time: float = 0.2  # seconds per blocked_autorange
    train_len: int = 2048  # forward+backward of the small model (configs/default.yaml's model) at this length
    train_tokens: int = 4096  # tokens per forward+backward (batch = train_tokens // train_len)
    max_bias_bytes: int = 256 << 20  # skip building a full (H, L, L) bias above this
    application: bool = True
    training: bool = True


# ---- references ---------------------------------------------------------------------------------------

def textbook_sinusoidal(length: int, d_model: int, device=None) -> torch.Tensor:
    """The original Transformer tutorials' table: float32 angles, torch.zeros + strided sin/cos assignment."""
    pe = torch.zeros(length, d_model, device=device)
    position = torch.arange(0, length, dtype=torch.float, device=device).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, device=device).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def hf_rotary(head_dim: int, length: int, device) -> Callable[[], tuple]:
    """transformers' LlamaRotaryEmbedding building cos/sin for ``length`` positions."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim, max_position_embeddings=length)
    rotary = LlamaRotaryEmbedding(cfg).to(device)
    x = torch.empty(1, dtype=torch.float32, device=device)
    pos = torch.arange(length, device=device)[None]
    return lambda: rotary(x, pos)


def llama_like(cfg: ModelConfig, train_len: int):
    """transformers' LlamaForCausalLM sized like our model: same width, depth, heads, vocabulary, tied
    embeddings, no biases, SDPA attention, RoPE theta 10000. Its SwiGLU MLP has 3 matrices, so its inner
    size is 8/3 of the width (rounded down) to match our 2-matrix 4x GELU MLP in parameters and FLOPs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    theta = float(cfg.encoding_options.get("rope", {}).get("theta", 10000.0))
    lc = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.mlp_ratio * cfg.d_model * 2 // 3,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        max_position_embeddings=train_len, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, use_cache=False,  # training: no KV cache
    )
    lc._attn_implementation = "sdpa"
    return LlamaForCausalLM(lc)


# ---- measuring -----------------------------------------------------------------------------------------

def measure(fn: Callable[[], object], min_run_time: float, warmup: int = 0) -> dict:
    """Median and IQR in seconds (torch.utils.benchmark; CUDA synchronisation handled by the Timer), run with
    torch's current intra-op thread count (the Timer's own default is a single thread). ``warmup`` untimed
    calls first: when variants that take a large fraction of a second alternate, the first call after a switch
    pays for page faults and cold caches that one of only two or three timed runs must not carry."""
    for _ in range(warmup):
        fn()
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = m.blocked_autorange(min_run_time=min_run_time)
    return {"median_s": m.median, "iqr_s": m.iqr, "runs": len(m.times)}


def floor_fns(n_values: int, n_transcendentals: int, device) -> tuple[Callable, Callable]:
    """Write n_values float32 (allocate + fill), and n_transcendentals float32 sin of realistic angles."""
    angles = (torch.arange(n_transcendentals, device=device, dtype=torch.float32) % 8192) * 0.37
    out = torch.empty_like(angles)
    return (lambda: torch.empty(n_values, device=device).fill_(0.5)), (lambda: torch.sin(angles, out=out))


def machine(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
            "cpu": cpu_model(), "python": platform.python_version()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---- the three parts ------------------------------------------------------------------------------------

def generation_rows(tc: TimingConfig, device: torch.device, length: int, log: Callable[[str], None]) -> list[dict]:
    from posenc_bench.encodings.absolute import sinusoidal_table
    from posenc_bench.encodings.rope import default_inv_freq, rope_cos_sin_halves

    t = tc.min_run_time
    d, D = tc.d_model, tc.head_dim
    H = max(1, d // D)
    rows = []

    def row(encoding, what, dims, fn, floor=None, reference=None, ref_name="", note="", **extra):
        timing = measure(fn, t)
        r = {"part": "generation", "encoding": encoding, "what": what, "length": length, "dims": dims,
             **timing, "floor_s": floor, "x_floor": timing["median_s"] / floor if floor else None,
             "reference": ref_name, "reference_s": None, "x_textbook": None, "note": note, **extra}
        if reference is not None:
            ref = measure(reference, t)
            r["reference_s"] = ref["median_s"]
            r["x_textbook"] = ref["median_s"] / timing["median_s"]
        rows.append(r)
        log(f"  gen {encoding:<12} {what:<34} L={length:<6} {timing['median_s'] * 1e3:8.3f} ms"
            + (f"  x{r['x_floor']:.2f} floor" if floor else "")
            + (f"  {r['x_textbook']:.1f}x faster than {ref_name}" if reference is not None else "")
            + (f"  (frequencies once: {extra['setup_s'] * 1e3:.3f} ms)" if "setup_s" in extra else ""))

    def floor(n_values, n_trans):
        write, trans = floor_fns(n_values, n_trans, device)
        tw, ts = measure(write, t)["median_s"], measure(trans, t)["median_s"] if n_trans else 0.0
        rows.append({"part": "floor", "encoding": "-", "what": f"write {n_values} fp32 / {n_trans} fp32 sin",
                     "length": length, "dims": "", "median_s": max(tw, ts), "iqr_s": None, "runs": None,
                     "floor_s": max(tw, ts), "write_s": tw, "sin_s": ts, "x_floor": 1.0, "reference": "",
                     "reference_s": None, "x_textbook": None, "note": ""})
        return max(tw, ts)

    f_sin = floor(length * d, length * d)
    row("sinusoidal", "table (L, d) fp32", f"{length}x{d}", lambda: sinusoidal_table(length, d, device=device), f_sin,
        lambda: textbook_sinusoidal(length, d, device), "textbook")
    pos = torch.arange(length, device=device)
    inv, scale = default_inv_freq(D)
    f_rope = floor(length * D, length * D)
    row("rope", "cos/sin cache (L, D/2) x 2", f"{length}x{D}", lambda: rope_cos_sin_halves(pos, inv, scale), f_rope,
        hf_rotary(D, length, device), "transformers LlamaRotaryEmbedding",
        note="transformers builds (L, D) x 2 with float32 angles")
    for name in scaled_rope_variants():
        # each zero-shot scaling as the model meets an eval length 4x its train length: the one-time
        # frequencies (set_eval_length, through transformers' ROPE_INIT_FUNCTIONS where it has them), then
        # the cos/sin cache every forward builds from them
        enc = encodings.build(name, d_model=D, n_heads=1, train_len=max(1, length // 4))
        setup = measure(lambda enc=enc: enc.set_eval_length(length), t)["median_s"]
        enc.set_eval_length(length)
        inv_s, scale_s = enc.inv_freq, enc.attention_scale
        row(name, "cos/sin cache at 4x train length", f"{length}x{D}", lambda inv_s=inv_s, scale_s=scale_s:
            rope_cos_sin_halves(pos, inv_s, scale_s), f_rope, setup_s=setup,
            note="setup_s: the frequencies, once per eval length")
    alibi = encodings.build("alibi", d_model=d, n_heads=H, train_len=length).to(device)
    f_alibi = floor(H * length * 2, 0)
    row("alibi", "folded bias factors (H, L) x 2", f"{H}x{length}", lambda: alibi.bias_factors(pos, pos), f_alibi)
    full_bytes = 4 * H * length * length
    if full_bytes <= tc.max_bias_bytes:
        f_full = floor(H * length * length, 0)
        row("alibi", "full bias (1, H, L, L) (explicit path)", f"{H}x{length}x{length}", lambda: alibi.bias(pos, pos), f_full)
        t5 = encodings.build("t5", d_model=d, n_heads=H, train_len=length).to(device)
        row("t5", "full bias (1, H, L, L)", f"{H}x{length}x{length}", lambda: t5.bias(pos, pos), f_full)
    else:
        log(f"  gen alibi/t5 full bias skipped at L={length}: {full_bytes / 2**30:.1f} GiB > max_bias_bytes")
    learned = encodings.build("learned", d_model=d, n_heads=H, train_len=length).to(device)
    f_learned = floor(length * d, 0)
    x = torch.zeros(1, length, d, device=device)
    with torch.no_grad():
        row("learned", "table lookup + add (L, d)", f"{length}x{d}", lambda: learned.embed(x, pos), f_learned)
    return rows


def attention_rows(tc: TimingConfig, device: torch.device, dtype: torch.dtype, length: int, log,
                   rounds: int = 3) -> list[dict]:
    """One attention layer's forward per encoding at ``length`` (batch 1), relative to the fused path.

    Like ``training_rows``, the variants are measured in turn ``rounds`` times and each round's ratio is
    taken against that round's fused time: at long lengths one forward takes most of a second, so a single
    blocked_autorange holds one or two runs and the machine's drift would otherwise land in the ratio."""
    d, D = tc.d_model, tc.head_dim
    H = max(1, d // D)
    cfg = ModelConfig(d_model=d, n_heads=H, n_layers=1)
    torch.manual_seed(0)
    layer = CausalSelfAttention(cfg).to(device, dtype)
    x = torch.randn(1, length, d, device=device, dtype=dtype)
    pos = torch.arange(length, device=device)
    forwards = {}
    fixes = zero_shot_fixes(length // 4)
    for name, explicit in [(n, False) for n in trained_encodings() + fixes] + [("alibi", True)]:
        # a zero-shot fix evaluates a model trained at a quarter of this length: its path at 4x
        enc = encodings.build(name, d_model=d, n_heads=H, train_len=length // 4 if name in fixes else length).to(device)
        enc.set_eval_length(length)
        if explicit:
            enc.has_low_rank_bias = False  # the straightforward (1, H, q, k) bias mask, for comparison
        h = enc.embed(x, pos)

        def fwd(enc=enc, h=h):
            with torch.no_grad():
                plan = AttentionPlan(enc, pos, None, 64 << 20)
                return layer(h, enc, plan)

        forwards[name + (" (explicit bias)" if explicit else "")] = fwd
    timings: dict[str, list[dict]] = {k: [] for k in forwards}
    for _ in range(rounds):
        for label, fwd in forwards.items():
            timings[label].append(measure(fwd, tc.min_run_time, warmup=1))
    rows = []
    for label, ts in timings.items():
        ratios = [t["median_s"] / f["median_s"] for t, f in zip(ts, timings["nope"])]
        mid = sorted(range(rounds), key=lambda i: ts[i]["median_s"])[rounds // 2]  # the median round
        rows.append({"part": "attention forward", "encoding": label, "what": f"one attention layer, batch 1, {rounds} rounds",
                     "length": length, "dims": f"{H}x{D}", **ts[mid], "runs": sum(t["runs"] for t in ts),
                     "x_fused": sorted(ratios)[rounds // 2], "x_fused_rounds": [round(r, 3) for r in ratios]})
        log(f"  attn {label:<24} L={length:<6} {ts[mid]['median_s'] * 1e3:9.2f} ms  x{rows[-1]['x_fused']:.2f} fused "
            f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    return rows


def scaled_rope_variants() -> list[str]:
    """The zero-shot RoPE scalings: RoPE subclasses evaluated on the trained rope model (the -ft rows use the
    same frequency functions)."""
    from posenc_bench.encodings.rope import RoPE
    from posenc_bench.encodings.rope_fixes import PairwiseRoPE

    return [n for n in encodings.available() if issubclass(encodings.get_class(n), RoPE)
            and not issubclass(encodings.get_class(n), PairwiseRoPE)
            and encodings.get_class(n).trained_as == "rope" and not encodings.get_class(n).finetuned]


def zero_shot_fixes(train_len: int) -> list[str]:
    """The rows that change each pair's relative position on the trained rope model (ReRoPE, Leaky ReRoPE,
    Self-Extend), and rope with the paper's 4 attention sinks in a cache of the train length."""
    from posenc_bench.encodings.rope_fixes import PairwiseRoPE
    from posenc_bench.encodings.sinks import PAPER_SINKS

    pairwise = [n for n in encodings.available() if issubclass(encodings.get_class(n), PairwiseRoPE)]
    return pairwise + [f"rope+sink{PAPER_SINKS}+sw{train_len - PAPER_SINKS}"]


def trained_encodings() -> list[str]:
    names = [n for n in encodings.available() if encodings.get_class(n).trained_as is None]
    return ["nope"] + [n for n in names if n != "nope"]  # the fused reference first


def _loss(model, batch):
    out = model(batch[:, :-1])
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def training_rows(tc: TimingConfig, device: torch.device, log, rounds: int = 3) -> list[dict]:
    """Forward+backward of configs/default.yaml's model at train_len per trained encoding, vs nope (fused).

    The variants are measured in turn, ``rounds`` times; each round's ratio is taken against that round's
    fused time and the median ratio reported with all of them (a shared machine drifts between rounds)."""
    T = tc.train_len
    B = max(1, tc.train_tokens // T)
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (B, T + 1), device=device)
    models = {}
    for name, explicit in [(n, False) for n in trained_encodings() if n != "learned"] + [("alibi", True), ("t5", True)]:
        model = DecoderLM(ModelConfig(), name, T, seed=0).to(device)
        if explicit:  # the straightforward path: a (1, H, q, k) bias mask through SDPA
            model.encoding.has_low_rank_bias = False
            model.encoding.has_distance_bias = False
        models[name + (" (explicit bias)" if explicit else "")] = model
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):
        for label, model in models.items():
            def step(model=model):
                _loss(model, batch).backward()
                model.zero_grad(set_to_none=True)

            times[label].append(measure(step, max(tc.min_run_time, 1.0), warmup=1)["median_s"])
    rows = []
    for label, ts in times.items():
        ratios = [t / f for t, f in zip(ts, times["nope"])]
        median = sorted(ratios)[len(ratios) // 2]
        rows.append({"part": "model forward+backward", "encoding": label, "what": f"batch {B}, {rounds} rounds",
                     "length": T, "dims": "d128 L4 H4", "median_s": sorted(ts)[len(ts) // 2], "iqr_s": None,
                     "runs": rounds, "x_fused": median, "x_fused_rounds": [round(r, 3) for r in ratios]})
        log(f"  train {label:<24} T={T:<6} {rows[-1]['median_s'] * 1e3:9.1f} ms  x{median:.2f} fused "
            f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})")
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
            _loss(model, data).backward()
            opt.step()

        return step

    steps = {"ours": stepper(ours), "llama": stepper(llama)}
    for step in steps.values():  # AdamW's state and first-call allocations stay out of the rounds
        step()
    ratios, times = [], {"ours": [], "llama": []}
    for _ in range(rounds):
        for k in ("ours", "llama"):
            times[k].append(measure(steps[k], min_run_time, warmup=1)["median_s"])
        ratios.append(times["llama"][-1] / times["ours"][-1])
    tokens = batch * train_len
    result = {
        "shape": f"batch {batch} x {train_len} tokens", "params_ours": sum(p.numel() for p in ours.parameters()),
        "params_llama": sum(p.numel() for p in llama.parameters()),
        "ours_tokens_per_s": [tokens / t for t in times["ours"]], "llama_tokens_per_s": [tokens / t for t in times["llama"]],
        "ratio": sorted(ratios)[len(ratios) // 2], "ratios": ratios,
        "note": "ours: LayerNorm, 4x GELU MLP; Llama: RMSNorm, SwiGLU with 8/3x inner size (same parameters +-0.2%)",
    }
    log(f"  training tokens/s at {result['shape']}, our rope model / LlamaForCausalLM ({result['params_ours']:,} vs "
        f"{result['params_llama']:,} parameters): {result['ratio']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    return result


# ---- the run --------------------------------------------------------------------------------------------

def run_timing(tc: TimingConfig, log: Callable[[str], None] = print) -> dict:
    from posenc_bench.env import git_commit, precision_dtype, resolve_device

    dtype = precision_dtype(tc.precision, PRECISIONS)  # ConfigError naming the valid ones
    if not tc.lengths or any(int(n) < 1 for n in tc.lengths):
        raise ConfigError(f"lengths must be positive integers, got {tc.lengths!r}")
    if tc.d_model % 2 or tc.head_dim % 2 or tc.d_model < tc.head_dim:
        raise ConfigError(f"d_model and head_dim must be even with head_dim <= d_model, got {tc.d_model}, {tc.head_dim}")
    device = resolve_device(tc.device)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    info = machine(device)
    log(f"timing on {info.get('gpu', info['cpu'])} ({device}, {info['threads']} threads, torch {info['torch']})")
    rows: list[dict] = []
    for length in tc.lengths:
        rows += generation_rows(tc, device, int(length), log)
    if tc.application:
        for length in tc.lengths:
            rows += attention_rows(tc, device, dtype, int(length), log)
    llama = llama_long = None
    if tc.training:
        rows += memory_rows(tc, device, log)
        rows += training_rows(tc, device, log)
        llama = versus_llama(device, log)  # the default run's shape, batch 32 x 128
        # and the forward+backward rows' shape, where attention is most of a step
        llama_long = versus_llama(device, log, train_len=tc.train_len, batch=max(1, tc.train_tokens // tc.train_len),
                                  rounds=5)
    return {"schema_version": 1, "config": asdict(tc), "machine": info, "commit": git_commit(),
            "rows": rows, "versus_llama": llama, "versus_llama_long": llama_long}


COLUMNS = ["part", "encoding", "what", "length", "dims", "median_ms", "iqr_ms", "floor_ms", "x_floor",
           "reference", "reference_ms", "x_textbook", "x_fused", "peak_mib", "setup_ms"]


def recorded_precision(result: dict) -> str:
    """The run's precision; timing.json files written before the rename call it ``dtype``."""
    cfg = result["config"]
    return cfg["precision"] if "precision" in cfg else cfg["dtype"]


def table_rows(result: dict) -> list[dict]:
    dev, dtype = result["machine"]["device"], recorded_precision(result)
    out = []
    for r in result["rows"]:
        ms = lambda v: None if v is None else round(v * 1e3, 4)  # noqa: E731
        rr = lambda v: None if v is None else round(v, 2)  # noqa: E731
        out.append({"device": dev, "dtype": dtype, "part": r["part"], "encoding": r["encoding"], "what": r["what"],
                    "length": r["length"], "dims": r["dims"], "median_ms": ms(r.get("median_s")), "iqr_ms": ms(r.get("iqr_s")),
                    "floor_ms": ms(r.get("floor_s")), "x_floor": rr(r.get("x_floor")), "reference": r.get("reference", ""),
                    "reference_ms": ms(r.get("reference_s")), "x_textbook": rr(r.get("x_textbook")), "x_fused": rr(r.get("x_fused")),
                    "peak_mib": r.get("peak_mib"), "setup_ms": ms(r.get("setup_s"))})
    return out


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def markdown(result: dict) -> str:
    from tabulate import tabulate

    m = result["machine"]
    head = (f"Timing on {m.get('gpu', m['cpu'])} ({m['device']}, {m['threads']} threads), torch {m['torch']}, "
            f"dtype {recorded_precision(result)}, commit {result['commit']}. Median of torch.utils.benchmark "
            f"blocked_autorange; IQR beside it. x_floor = time / floor (the larger of writing the output and one fp32 "
            f"sin per value); x_textbook = reference time / ours (> 1: ours faster); x_fused = time / the same work on "
            f"SDPA's fused causal path (nope); setup_ms = a RoPE scaling's frequencies, computed once per eval length.\n")
    rows = table_rows(result)
    parts = []
    for part in dict.fromkeys(r["part"] for r in rows):
        sel = [{k: v for k, v in r.items() if k not in ("device", "dtype", "part")} for r in rows if r["part"] == part]
        keep = [k for k in sel[0] if any(s[k] not in (None, "") for s in sel)]
        parts.append(f"### {part}\n\n" + tabulate([[s[k] for k in keep] for s in sel], headers=keep, tablefmt="github"))
    text = head + "\n" + "\n\n".join(parts) + "\n"
    for v in (result.get("versus_llama"), result.get("versus_llama_long")):
        if not v:
            continue
        text += (f"\nTraining step (forward, backward, AdamW), {v['shape']}: our rope model / transformers "
                 f"LlamaForCausalLM tokens/s = **{v['ratio']:.2f}x**, the median of the paired rounds "
                 f"{', '.join(f'{r:.2f}' for r in v['ratios'])} (tokens/s, each side's own median: ours "
                 f"{_median(v['ours_tokens_per_s']):,.0f}, Llama {_median(v['llama_tokens_per_s']):,.0f}; "
                 f"{v['params_ours']:,} vs {v['params_llama']:,} parameters; {v['note']}).\n")
    return text


def write_outputs(result: dict, out: Path | str) -> Path:
    out = Path(out)
    atomic_write_json(out / "timing.json", result)
    rows = table_rows(result)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "timing.csv", buf.getvalue())
    atomic_write_text(out / "timing.md", markdown(result))
    return out



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
    import json
    import subprocess
    import sys

    # the folder that holds this posenc_bench package (not the package itself: its encodings/ would shadow
    # the standard library's and the interpreter would not start)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, name, str(train_len), str(length), str(batch),
                           str(torch.get_num_threads())], capture_output=True, text=True, env=env)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the peak-memory forward of {name!r} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


def memory_rows(tc: TimingConfig, device: torch.device, log) -> list[dict]:
    """Eval forward at 4x the train length (the default run's 128 -> 512, batch of eval.batch_tokens=16384
    tokens): peak extra memory per encoding relative to the fused path (nope)."""
    train_len, length = 128, 512
    batch = 16384 // length
    rows, base = [], None
    for name in [n for n in trained_encodings() if n != "learned"] + zero_shot_fixes(train_len):
        peak = eval_peak_memory(name, device, train_len, length, batch)
        if peak is None:
            return []
        base = peak if name == "nope" else base
        rows.append({"part": "eval peak memory", "encoding": name, "what": f"forward at 4x, batch {batch}",
                     "length": length, "dims": "d128 L4 H4", "median_s": None, "iqr_s": None, "runs": 1,
                     "peak_mib": round(peak / 2**20, 1), "x_fused": peak / base if base else None})
        log(f"  memory {name:<12} L={length:<6} peak +{peak / 2**20:8.1f} MiB  x{peak / base if base else float('nan'):.2f} fused")
    return rows
