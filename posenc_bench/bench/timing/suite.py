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
  ``train_len`` (also ``x_fused``), with its peak memory, tokens/s and, on CUDA, its MFU (``training.py``,
  ``mfu.py``).
- Eval peak memory: every encoding at 4x the default run's train length, and the bias encodings at 4x
  ``train_len``, batch 1 (``bench/eval/memory.py``).
- Training throughput of our RoPE model against transformers' ``LlamaForCausalLM`` of the same size.

What is timed is the registry's: every trained encoding (``encodings.trained()``) and the zero-shot rows of the
rope model (``encodings.variants``). The references live in ``references.py``, the measuring in
``measure.py``, the training part in ``training.py``, the peak memory in ``bench/eval/memory.py``. ``PARTS``
names the parts; a run may skip some and time fewer trained encodings (``TimingConfig.skip``, ``encodings``).
"""

from __future__ import annotations

import csv
import io
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from posenc_bench import encodings, native
from posenc_bench.bench.eval import memory as eval_memory
from posenc_bench.bench.timing import mfu
from posenc_bench.bench.timing.measure import (CLOCK_STEPS, FUSED, alternate_rounds, clock_resolution, measure, median,
                                              speed_words, versus_fused)
from posenc_bench.bench.timing.training import EXPLICIT, training_rows, versus_llama
from posenc_bench.bench.timing.references import floor_fns, hf_rotary, textbook_sinusoidal
from posenc_bench.bench.rows import Row
from posenc_bench.encodings.sinks import PAPER_SINKS
from posenc_bench.env import cpu_name, git_commit, precision_dtype, resolve_device, threads_in_words
from posenc_bench.errors import ConfigError
from posenc_bench.files import atomic_write_json, atomic_write_text
from posenc_bench.model.attention import AttentionPlan
from posenc_bench.model.transformer import CausalSelfAttention, ModelConfig
from posenc_bench.values import TRAIN_PRECISIONS


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
    train_min_run_time: float = 1.0  # seconds per blocked_autorange of a forward+backward (at least min_run_time)
    encodings: Optional[list] = None  # the trained encodings timed (None: all; nope always; rope's fixes with rope)
    skip: list = field(default_factory=list)  # parts left out, of PARTS
    eval_len: int = 0  # the bias encodings' eval peak memory at this length (0: 4 x train_len) ...
    eval_batch: int = 1  # ... and batch, the model trained at train_len
    peak_tflops: Optional[float] = None  # the device's peak for MFU (None: mfu.PEAK_TFLOPS by the GPU's name)


# generation; one attention layer; eval peak memory at 4x the default run's length; the bias encodings' eval peak
# memory at 4x train_len; forward+backward with peak memory and MFU; the training step against Llama
PARTS = ("generation", "attention", "memory", "bias-memory", "training", "llama")


def parts(tc: TimingConfig) -> list[str]:
    """The parts ``tc`` runs: PARTS less ``skip``, less the application and training parts when those are off;
    ConfigError for a name that is no part."""
    bad = [p for p in tc.skip if p not in PARTS]
    if bad:
        raise ConfigError(f"skip {', '.join(map(repr, bad))}: the parts are {', '.join(PARTS)}")
    off = set(tc.skip) | (set() if tc.application else {"attention"}) | (set() if tc.training else set(PARTS[2:]))
    return [p for p in PARTS if p not in off]


def timed_encodings(tc: TimingConfig) -> list[str]:
    """The trained encodings ``tc`` times, the fused path first; ConfigError for one that is not trained."""
    every = encodings.trained()
    if tc.encodings is None:
        return fused_first(every)
    bad = [n for n in tc.encodings if n not in every]
    if bad:
        raise ConfigError(f"encodings {', '.join(map(repr, bad))} are not trained encodings; valid: {', '.join(every)}")
    return fused_first(list(dict.fromkeys([FUSED, *tc.encodings])))


def bias_encodings(names: list[str]) -> list[str]:
    """The relative-bias family among ``names`` (T5, ALiBi, KERPLE, FIRE: the registry's family), whose bias
    at a long eval length is the memory a fused path does not pay."""
    return [n for n in names if encodings.family(encodings.get_class(n)) == "relative bias"]


# ---- what is timed --------------------------------------------------------------------------------------

def fused_first(names: list[str]) -> list[str]:
    """``names`` with the fused reference first (the order of the rows in the tables)."""
    return sorted(names, key=lambda n: n != FUSED)


def rope_fixes(train_len: int) -> list[str]:
    """The zero-shot fixes of the trained rope model that change each pair's relative position (ReRoPE, Leaky
    ReRoPE, Self-Extend: the registry's "rotary fix (zero-shot)" family), and rope with the paper's attention
    sinks in a cache of the train length."""
    return (encodings.variants("rope", family="rotary fix (zero-shot)")
            + [Row("rope").with_sinks(PAPER_SINKS, train_len - PAPER_SINKS).encoding])


def machine(device: torch.device) -> dict:
    """Where the numbers were measured: torch, the device, its thread count, the CPU (``env.cpu_name``: model
    and instruction set), the C compiler of the CPU kernels (``native``; None: CoPE and FIRE ran on torch ops),
    the GPU, and the effective resolution of the clock the Timer reads."""
    info = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
            "cpu": cpu_name(), "python": platform.python_version(), "timer_resolution_s": clock_resolution(),
            "cc": native.compiler_version()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


# ---- the three parts ------------------------------------------------------------------------------------

def generation_rows(tc: TimingConfig, device: torch.device, length: int, log: Callable[[str], None]) -> list[dict]:
    """What each encoding builds for ``length`` positions, next to the floor and the references."""
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
            r["clock_bound"] = timing["clock_bound"] or ref["clock_bound"]
        rows.append(r)
        log(f"  gen {encoding:<12} {what:<34} L={length:<6} {timing['median_s'] * 1e3:8.3f} ms"
            + (f"  x{r['x_floor']:.2f} floor" if floor else "")
            + (f"  {speed_words(r['x_textbook'], ref_name)}" if reference is not None else "")
            + (f"  (frequencies once: {extra['setup_s'] * 1e3:.3f} ms)" if "setup_s" in extra else ""))

    def floor(n_values, n_trans):
        write, trans = floor_fns(n_values, n_trans, device)
        w = measure(write, t)
        sin = measure(trans, t) if n_trans else {"median_s": 0.0, "clock_bound": False}
        tw, ts = w["median_s"], sin["median_s"]
        rows.append({"part": "floor", "encoding": "-", "what": f"write {n_values} fp32 / {n_trans} fp32 sin",
                     "length": length, "dims": "", "median_s": max(tw, ts), "iqr_s": None, "runs": None,
                     "floor_s": max(tw, ts), "write_s": tw, "sin_s": ts, "x_floor": 1.0, "reference": "",
                     "reference_s": None, "x_textbook": None, "note": "",
                     "clock_bound": w["clock_bound"] or sin["clock_bound"]})
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
    for name in encodings.variants("rope", family="rotary scaling (zero-shot)"):
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
                   names: Optional[list[str]] = None, rounds: int = 3) -> list[dict]:
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
    names = fused_first(encodings.trained()) if names is None else names
    fixes = rope_fixes(length // 4) if "rope" in names else []
    for name, explicit in [(n, False) for n in names + fixes] + [("alibi", True)] * ("alibi" in names):
        # a zero-shot fix evaluates a model trained at a quarter of this length: its path at 4x
        enc = encodings.build(name, d_model=d, n_heads=H, train_len=length // 4 if name in fixes else length).to(device)
        enc.set_eval_length(length)
        if explicit:
            eval_memory.bias_as_mask(enc)  # the straightforward (1, H, q, k) bias mask, for comparison
        h = enc.embed(x, pos)

        def fwd(enc=enc, h=h):
            with torch.no_grad():
                plan = AttentionPlan(enc, pos, None, 64 << 20)
                return layer(h, enc, plan)

        forwards[name + (EXPLICIT if explicit else "")] = fwd
    timings, ratios = alternate_rounds(forwards, FUSED, rounds=rounds, min_run_time=tc.min_run_time)
    rows = []
    for label, ts in timings.items():
        mid = sorted(range(rounds), key=lambda i: ts[i]["median_s"])[rounds // 2]  # the median round
        fused, words = versus_fused(ts, ratios[label])
        rows.append({"part": "attention forward", "encoding": label, "what": f"one attention layer, batch 1, {rounds} rounds",
                     "length": length, "dims": f"{H}x{D}", **ts[mid], "runs": sum(t["runs"] for t in ts), **fused})
        log(f"  attn {label:<24} L={length:<6} {ts[mid]['median_s'] * 1e3:9.2f} ms  {words}")
    return rows


# ---- rows the clock decided -----------------------------------------------------------------------------

def seconds(value: float) -> str:
    """A short duration for the log and timing.md: "41 ns", "1.5 us", "8 ms"."""
    scale, unit = next(((s, u) for s, u in ((1, "s"), (1e-3, "ms"), (1e-6, "us")) if value >= s), (1e-9, "ns"))
    return f"{value / scale:.3g} {unit}"


def row_label(row: dict) -> str:
    """A row by name: "attention forward rope, L=2048"; a floor or generation row with what it builds (one
    encoding builds several things, the floor has none)."""
    name = row["part"] + ("" if row["encoding"] == "-" else f" {row['encoding']}")
    what = [row["what"]] if row["part"] in ("floor", "generation") else []
    return ", ".join([name, *what, f"L={row['length']}"])


def clock_note(result: dict) -> Optional[str]:
    """The rows whose number is the clock's rather than the work's (``measure.clock_bound``), named for the
    log and timing.md; None when there are none."""
    bound = [row_label(r) for r in result["rows"] if r.get("clock_bound")]
    if not bound:
        return None
    return (f"{len(bound)} row(s) timed within {CLOCK_STEPS} steps of the clock's resolution "
            f"({seconds(result['machine']['timer_resolution_s'])}) or with IQR 0 over several runs: their medians "
            f"are the clock's step, not the work: {'; '.join(bound)}")


# ---- the run --------------------------------------------------------------------------------------------

def run_timing(tc: TimingConfig, log: Callable[[str], None] = print,
               keep: Callable[[dict], None] = lambda result: None) -> dict:
    """Every part of ``tc`` in turn; ``keep`` is given the result so far after each part (the command writes it
    to timing.partial.json, so an hour of measurements survives a failure or an interrupt in a later part)."""
    dtype = precision_dtype(tc.precision, TRAIN_PRECISIONS)  # ConfigError naming the valid ones
    todo, names = parts(tc), timed_encodings(tc)
    if tc.peak_tflops is not None and tc.peak_tflops <= 0:
        raise ConfigError(f"peak_tflops must be positive, got {tc.peak_tflops!r}")
    if not tc.lengths or any(int(n) < 1 for n in tc.lengths):
        raise ConfigError(f"lengths must be positive integers, got {tc.lengths!r}")
    if tc.d_model % 2 or tc.head_dim % 2 or tc.d_model < tc.head_dim:
        raise ConfigError(f"d_model and head_dim must be even with head_dim <= d_model, got {tc.d_model}, {tc.head_dim}")
    device = resolve_device(tc.device)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    info = machine(device)
    log(f"timing on {device}: {info.get('gpu', info['cpu'])}, {threads_in_words(info['threads'])}, torch {info['torch']}, "
        f"timer resolution {seconds(info['timer_resolution_s'])}")
    peak, peak_source = mfu.peak_flops(info.get("gpu"), tc.precision, tc.peak_tflops)
    rows: list[dict] = []
    result = {"schema_version": 1, "config": asdict(tc), "machine": info, "commit": git_commit(),
              "rows": rows, "versus_llama": None, "versus_llama_long": None,
              "mfu": {"peak_flops": peak, "peak": peak_source, "flop_count": mfu.FLOP_COUNT}}
    for length in tc.lengths if "generation" in todo else []:
        rows += generation_rows(tc, device, int(length), log)
        keep(result)
    for length in tc.lengths if "attention" in todo else []:
        rows += attention_rows(tc, device, dtype, int(length), log, names)
        keep(result)
    if "memory" in todo:  # a row that cannot run at 4x (a learned table) is n/a there, as in a sweep
        fixes = rope_fixes(eval_memory.TRAIN_LEN) if "rope" in names else []
        rows += eval_memory.memory_rows(device, names + fixes, FUSED, log, precision=tc.precision)
        keep(result)
    if "bias-memory" in todo:
        rows += eval_memory.memory_rows(device, [FUSED] + bias_encodings(names), FUSED, log, train_len=tc.train_len,
                                        length=tc.eval_len or 4 * tc.train_len, batch=tc.eval_batch, precision=tc.precision)
        keep(result)
    if "training" in todo:
        rows += training_rows(tc, device, log, names, peak)
        log(f"  MFU: {peak_source}; FLOPs a step: {mfu.FLOP_COUNT}")
        keep(result)
    if "llama" in todo:
        result["versus_llama"] = versus_llama(device, log)  # the default run's shape, batch 32 x 128
        # and the forward+backward rows' shape, where attention is most of a step
        result["versus_llama_long"] = versus_llama(device, log, train_len=tc.train_len, rounds=5,
                                                   batch=max(1, tc.train_tokens // tc.train_len))
    if note := clock_note(result):
        log(f"warning: {note}")
    return result


COLUMNS = ["part", "encoding", "what", "length", "dims", "median_ms", "iqr_ms", "floor_ms", "x_floor",
           "reference", "reference_ms", "x_textbook", "x_fused", "peak_mib", "peak_x_fused", "tokens_per_s", "tflops",
           "mfu_pct", "setup_ms"]


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
                    "peak_mib": r.get("peak_mib"), "peak_x_fused": rr(r.get("peak_x_fused")),
                    "tokens_per_s": None if r.get("tokens_per_s") is None else round(r["tokens_per_s"]),
                    "tflops": None if r.get("tflops") is None else round(r["tflops"], 3),
                    "mfu_pct": None if r.get("mfu") is None else round(100 * r["mfu"], 2), "setup_ms": ms(r.get("setup_s"))})
    return out


def markdown(result: dict) -> str:
    from tabulate import tabulate

    m = result["machine"]
    clock = f", timer resolution {seconds(m['timer_resolution_s'])}" if "timer_resolution_s" in m else ""
    head = (f"Timing on {m['device']}: {m.get('gpu', m['cpu'])}, {m['threads']} threads, torch {m['torch']}{clock}, "
            f"dtype {recorded_precision(result)}, commit {result['commit']}. Median of torch.utils.benchmark "
            f"blocked_autorange; IQR beside it. x_floor = time / floor (the larger of writing the output and one fp32 "
            f"sin per value); x_textbook = reference time / ours (> 1: ours faster); x_fused = time / the same work on "
            f"SDPA's fused causal path (nope); setup_ms = a RoPE scaling's frequencies, computed once per eval length; "
            f"peak_mib = the extra peak memory of the forward (eval) or forward+backward (training), peak_x_fused its "
            f"ratio to the fused path's; tflops = a step's model FLOPs / its time, mfu_pct = that over the device's "
            f"peak (CUDA only).\n")
    if (m_fu := result.get("mfu")) and any(r["part"] == "model forward+backward" for r in result["rows"]):
        head += f"\nMFU peak: {m_fu['peak']}. FLOPs a step: {m_fu['flop_count']}.\n"
    rows = table_rows(result)
    tables = []
    for part in dict.fromkeys(r["part"] for r in rows):
        sel = [{k: v for k, v in r.items() if k not in ("device", "dtype", "part")} for r in rows if r["part"] == part]
        keep = [k for k in sel[0] if any(s[k] not in (None, "") for s in sel)]
        tables.append(f"### {part}\n\n" + tabulate([[s[k] for k in keep] for s in sel], headers=keep, tablefmt="github"))
    note = clock_note(result)
    text = head + (f"\n**Clock-bound:** {note}.\n" if note else "")
    text += "\n" + "\n\n".join(tables) + "\n"
    for v in (result.get("versus_llama"), result.get("versus_llama_long")):
        if not v:
            continue
        text += (f"\nTraining step (forward, backward, AdamW), {v['shape']}: our rope model / transformers "
                 f"LlamaForCausalLM tokens/s = **{v['ratio']:.2f}x**, the median of the paired rounds "
                 f"{', '.join(f'{r:.2f}' for r in v['ratios'])} (tokens/s, each side's own median: ours "
                 f"{median(v['ours_tokens_per_s']):,.0f}, Llama {median(v['llama_tokens_per_s']):,.0f}; "
                 f"{v['params_ours']:,} vs {v['params_llama']:,} parameters; {v['note']}).\n")
    return text


PARTIAL = "timing.partial.json"  # the parts measured so far, while a run is under way (run_timing's ``keep``)


def keep_partial(out: Path | str) -> Callable[[dict], None]:
    """``run_timing``'s ``keep`` for output folder ``out``: the result so far, written atomically to PARTIAL."""
    return lambda result: atomic_write_json(Path(out) / PARTIAL, result)


def write_outputs(result: dict, out: Path | str) -> Path:
    """timing.json, timing.csv and timing.md of a finished run into ``out``; its partial file goes."""
    out = Path(out)
    atomic_write_json(out / "timing.json", result)
    rows = table_rows(result)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "timing.csv", buf.getvalue())
    atomic_write_text(out / "timing.md", markdown(result))
    (out / PARTIAL).unlink(missing_ok=True)
    return out
