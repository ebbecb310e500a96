"""`posenc-bench eval`: pretrained models (Hugging Face, or our own checkpoints) through the same protocol.

A Hugging Face model (``hf:<local folder | hub name | path/to/file.gguf>``) is loaded with
``AutoModelForCausalLM`` / ``AutoTokenizer`` (``trust_remote_code`` only when the user asks for it), in
inference mode, batch 1, SDPA attention. Its train length is its own (``max_position_embeddings``, or the
original length of an already-scaled model), overridable; eval lengths are multiples of it.

Text: the held-out documents of ``data.py``'s corpus go through the model's own tokenizer, each document
preceded by a separator token (BOS when the tokenizer adds one itself, else EOS: the document boundary as
the model saw it in pretraining). Every token carries the UTF-8 bytes of text it covers (from the
tokenizer's offsets; the separator covers none), so bits per byte compare across tokenizers. Segments,
windows, token-weighted ppl and the loss by position are ``evaluate.py``'s, unchanged.

RoPE scalings (rows ``hf:<model>+linear``, ``+dynamic``, ``+yarn``, ``+llama3``) are applied by rebuilding
the model's rotary-embedding module from a copy of its config whose ``rope_parameters`` name the scaling,
so transformers' own ``ROPE_INIT_FUNCTIONS`` (and, for dynamic NTK, its per-forward update) compute the
frequencies. factor = eval length / train length (never below 1); yarn and llama3 get
``original_max_position_embeddings`` = the train length (llama3 also its published low/high frequency
factors 1 and 4). A model without rotary embeddings gets ``n/a`` for every scaling, and ``n/a`` past its
absolute position table.

The loss is computed from the last hidden state with the LM head applied to chunks of positions, never a
full (L, vocab) float32 logits tensor; a check at load time compares this path with the model's own logits
and falls back to them if the model post-processes its logits (e.g. soft-capping).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F

from posenc_bench.errors import ConfigError, DataError, PosencError

SCALINGS = ("linear", "dynamic", "yarn", "llama3")
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's published values
DEFAULT_EVAL_TOKENS = 16384
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass
class EvalOptions:
    """Everything `posenc-bench eval` takes (the CLI flags, one to one)."""

    model: str
    eval_lens: Optional[list] = None  # None: the checkpoint's own config, or 1,1.5,2,4x for a HF model
    rope_scaling: list = field(default_factory=list)
    train_len: Optional[int] = None
    data: Optional[str] = None  # None: the checkpoint's own corpus, or stdlib
    eval_tokens: Optional[int] = None
    out: Optional[str] = None
    device: str = "auto"
    dtype: str = "float32"
    trust_remote_code: bool = False
    doc_sep: str = "auto"
    fresh: bool = False
    show_progress: Optional[bool] = None


def parse_scalings(value: str) -> list[str]:
    """'linear,yarn' -> ['linear', 'yarn']; 'all' = every scaling; 'none' or '' = none."""
    items = [v.strip().lower() for v in value.split(",") if v.strip()]
    out: list[str] = []
    for item in items:
        if item == "all":
            out.extend(SCALINGS)
        elif item in SCALINGS:
            out.append(item)
        elif item != "none":
            raise ConfigError(f"--rope-scaling {item!r} is not a scaling; valid: {', '.join(SCALINGS)}, all, none")
    return list(dict.fromkeys(out))


# ---- which model ------------------------------------------------------------------------------------------

@dataclass
class ModelSpec:
    kind: str  # "hf" | "checkpoint"
    ref: str  # what from_pretrained gets (folder or hub name), or the checkpoint folder
    name: str  # short name for row labels
    gguf_file: Optional[str] = None


def resolve_model(spec: str) -> ModelSpec:
    if spec.startswith("hf:"):
        rest = spec[3:]
        path = Path(rest).expanduser()
        if rest.lower().endswith(".gguf"):
            if not path.is_file():
                raise ConfigError(f"--model {spec!r}: no GGUF file at {str(path)!r}")
            return ModelSpec("hf", str(path.resolve().parent), path.stem, gguf_file=path.name)
        if path.is_dir():
            return ModelSpec("hf", str(path), path.resolve().name)
        if rest.startswith((".", "/", "~")) or not _HUB_NAME.match(rest):
            raise ConfigError(f"--model {spec!r}: {rest!r} is not a folder, and not a hub name (org/name)")
        return ModelSpec("hf", rest, rest)
    path = Path(spec).expanduser()
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return ModelSpec("checkpoint", str(path), path.name)
    raise ConfigError(
        f"--model {spec!r}: expected hf:<local folder | hub name | file.gguf>, or one of our checkpoint folders "
        "holding model.safetensors and config.json (e.g. results/run/checkpoints/rope-seed0)"
    )


def file_hash(paths: list[Path]) -> str:
    """sha256 over the contents of ``paths`` (in name order), 16 hex digits."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda p: p.name):
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


# ---- the model --------------------------------------------------------------------------------------------

class HFModel:
    """A causal LM from transformers, its tokenizer, its RoPE modules, and a chunked NLL."""

    def __init__(self, spec: ModelSpec, *, device: torch.device, dtype: str = "float32",
                 trust_remote_code: bool = False, head_chunk_bytes: int = 32 << 20) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in _DTYPES:
            raise ConfigError(f"--dtype {dtype!r} is not supported; valid: {', '.join(_DTYPES)}")
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.head_chunk_bytes = head_chunk_bytes
        kwargs: dict = {"trust_remote_code": trust_remote_code}
        if spec.gguf_file:
            kwargs["gguf_file"] = spec.gguf_file
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # "Loading weights" bars on stderr; our own progress is enough
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(spec.ref, **kwargs)
            try:
                model = AutoModelForCausalLM.from_pretrained(spec.ref, dtype=_DTYPES[dtype], attn_implementation="sdpa", **kwargs)
                self.attention = "sdpa"
            except ValueError as e:
                if "sdpa" not in str(e).lower():
                    raise
                model = AutoModelForCausalLM.from_pretrained(spec.ref, dtype=_DTYPES[dtype], **kwargs)
                self.attention = model.config._attn_implementation
        except (OSError, ValueError, ImportError, KeyError) as e:
            hint = "" if trust_remote_code or "trust_remote_code" not in str(e) else " (add --trust-remote-code if you trust its code)"
            raise ConfigError(f"cannot load model {spec.ref!r}{' file ' + spec.gguf_file if spec.gguf_file else ''}: "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}") from None
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self.model = model.eval().to(device)
        self.config = self.model.config
        # (parent module, attribute, rotary module) for every rotary embedding the model built from its config
        self.rotary = []
        for parent in self.model.modules():
            for attr, child in parent.named_children():
                if hasattr(child, "inv_freq") and hasattr(child, "rope_type") and hasattr(child, "config"):
                    self.rotary.append((parent, attr, child))
        self.chunked = self._check_chunked_head()

    # -- identity ---------------------------------------------------------------------------------------
    def describe(self) -> dict:
        spec, tok = self.spec, self.tokenizer
        if spec.gguf_file:
            revision = {"file_sha256": file_hash([Path(spec.ref) / spec.gguf_file])}
        elif Path(spec.ref).is_dir():
            files = [p for p in Path(spec.ref).iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".json", ".model")]
            revision = {"files_sha256": file_hash(files)}
        else:
            revision = {"hub_commit": getattr(self.config, "_commit_hash", None)}
        return {
            "kind": "hf", "model": spec.name, "ref": spec.ref, "gguf_file": spec.gguf_file, **revision,
            "class": type(self.model).__name__, "model_type": getattr(self.config, "model_type", None),
            "params": sum(p.numel() for p in self.model.parameters()),
            "max_position_embeddings": getattr(self.config, "max_position_embeddings", None),
            "rope_parameters": self.rope_parameters(), "dtype": self.dtype, "attention": self.attention,
            "chunked_head": self.chunked,
            "tokenizer": {"class": type(tok).__name__, "name_or_path": tok.name_or_path, "vocab_size": len(tok),
                          "bos": tok.bos_token, "eos": tok.eos_token},
        }

    def rope_parameters(self) -> Optional[dict]:
        rp = getattr(self.config, "rope_parameters", None)
        return dict(rp) if rp else None

    def rope_problem(self) -> Optional[str]:
        """Why RoPE scalings cannot be applied to this model, or None if they can."""
        rp = self.rope_parameters()
        if not self.rotary or not rp:
            return (f"{type(self.model).__name__} has no rotary position embedding "
                    f"(not a RoPE model); RoPE scalings do not apply")
        if "rope_type" not in rp or not isinstance(rp.get("rope_theta"), (int, float)):
            return f"{type(self.model).__name__} has per-layer rope_parameters {sorted(rp)}; scalings of those are not supported"
        return None

    def own_train_len(self) -> tuple[int, str]:
        """(train length, where it comes from): the pre-scaling length of an already-scaled model."""
        rp = self.rope_parameters() or {}
        if rp.get("rope_type", "default") != "default" and rp.get("original_max_position_embeddings"):
            return int(rp["original_max_position_embeddings"]), "rope_parameters.original_max_position_embeddings"
        if getattr(self.config, "original_max_position_embeddings", None):
            return int(self.config.original_max_position_embeddings), "original_max_position_embeddings"
        mpe = getattr(self.config, "max_position_embeddings", None)
        if not mpe:
            raise ConfigError(f"{type(self.model).__name__}'s config has no max_position_embeddings; give --train-len")
        return int(mpe), "max_position_embeddings"

    def position_limit(self) -> Optional[int]:
        """Longest input a non-RoPE model with an absolute position table can take (None: no such limit)."""
        if self.rotary:
            return None
        mpe = getattr(self.config, "max_position_embeddings", None)
        return int(mpe) if mpe else None

    # -- scaling ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scaled(self, rope_parameters: Optional[dict], max_position_embeddings: int) -> Iterator[None]:
        """Rotary modules rebuilt from a config copy with these rope_parameters; the originals are put back after."""
        if rope_parameters is None:
            yield
            return
        originals = []
        try:
            for parent, attr, module in self.rotary:
                cfg = copy.deepcopy(module.config)
                cfg.rope_parameters = dict(rope_parameters)
                cfg.max_position_embeddings = max_position_embeddings
                try:
                    new = type(module)(config=cfg)
                except TypeError as e:
                    raise PosencError(f"cannot rebuild {type(module).__name__} from a config: {e}") from None
                originals.append((parent, attr, module))
                setattr(parent, attr, new.to(self.device))
            yield
        finally:
            for parent, attr, module in originals:
                setattr(parent, attr, module)

    def scaling_is_identity(self, length: int) -> bool:
        """Inside ``scaled``: do the rotary modules give the unscaled model's cos/sin at this length (same
        inv_freq and attention scale, and no dynamic update below it)? Then its numbers are the unscaled ones."""
        for (parent, attr, original) in self.rotary:
            new = getattr(parent, attr)
            if new is original:
                continue
            if "dynamic" in new.rope_type and length > new.original_max_seq_len:
                return False
            if not torch.equal(new.inv_freq, original.inv_freq) or new.attention_scaling != original.attention_scaling:
                return False
        return True

    def rotary_modules(self) -> list[torch.nn.Module]:
        return [getattr(parent, attr) for parent, attr, _ in self.rotary]

    # -- loss -------------------------------------------------------------------------------------------
    def _head_nll(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=x).last_hidden_state  # (b, l, C)
        head = self.model.get_output_embeddings()
        b, l, _ = hidden.shape
        chunk = max(1, self.head_chunk_bytes // (4 * b * head.weight.shape[0]))
        y = y.to(hidden.device)
        out = []
        for s in range(0, l, chunk):
            logits = head(hidden[:, s : s + chunk]).float()  # (b, chunk, V): the only logits alive at a time
            out.append(F.cross_entropy(logits.flatten(0, 1), y[:, s : s + chunk].flatten(), reduction="none").view(b, -1))
        return torch.cat(out, dim=1)

    def _full_nll(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=x).logits.float()  # (b, l, V)
        return F.cross_entropy(logits.flatten(0, 1), y.to(logits.device).flatten(), reduction="none").view(y.shape)

    @torch.inference_mode()
    def _check_chunked_head(self) -> bool:
        """True if last hidden state -> output embeddings reproduces the model's own logits (no post-processing)."""
        head = self.model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            return False
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, min(len(self.tokenizer), head.weight.shape[0]), (1, 8), generator=g).to(self.device)
        try:
            mine = head(self.model.base_model(input_ids=x).last_hidden_state).float()
        except (TypeError, AttributeError):
            return False
        theirs = self.model(input_ids=x).logits.float()
        tol = 1e-4 if self.dtype == "float32" else 2e-2
        return mine.shape == theirs.shape and torch.allclose(mine, theirs, rtol=tol, atol=tol)

    def nll(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(b, l) NLL of targets y given inputs x, positions from 0."""
        return self._head_nll(x, y) if self.chunked else self._full_nll(x, y)


def scaling_parameters(base: dict, scaling: str, factor: float, train_len: int) -> dict:
    """The rope_parameters transformers reads for ``scaling`` at ``factor``; keeps theta and partial rotary."""
    if scaling not in SCALINGS:
        raise ConfigError(f"unknown RoPE scaling {scaling!r}; valid: {', '.join(SCALINGS)}")
    params = {"rope_type": scaling, "rope_theta": base["rope_theta"], "factor": float(factor)}
    if "partial_rotary_factor" in base:
        params["partial_rotary_factor"] = base["partial_rotary_factor"]
    if scaling in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = int(train_len)
    if scaling == "llama3":
        params.update(LLAMA3_FREQ_FACTORS)
    return params


def scaled_max_positions(scaling: str, factor: float, train_len: int) -> int:
    """max_position_embeddings of the scaled config: dynamic NTK measures growth against it (= train length);
    for the others it is the extended context, train length x factor."""
    return train_len if scaling == "dynamic" else int(round(train_len * factor))


# ---- text through the model's tokenizer -------------------------------------------------------------------

def document_separator(tokenizer, choice: str = "auto") -> tuple[Optional[int], str]:
    """(token id put before every document or None, how it was chosen)."""
    if choice == "none":
        return None, "none"
    if choice != "auto":
        vocab = tokenizer.get_vocab()
        if choice not in vocab:
            raise ConfigError(f"--doc-sep {choice!r} is not a token of this tokenizer; give auto, none, or a token "
                              f"such as {', '.join(repr(t) for t in tokenizer.all_special_tokens[:5])}")
        return vocab[choice], f"{choice!r} (given)"
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    probe = tokenizer("a")["input_ids"]
    if bos is not None and probe and probe[0] == bos:
        return bos, f"bos {tokenizer.bos_token!r} (the tokenizer adds it)"
    if eos is not None:
        return eos, f"eos {tokenizer.eos_token!r} (between documents, GPT-2 style)"
    if bos is not None:
        return bos, f"bos {tokenizer.bos_token!r}"
    return None, "none (the tokenizer has no bos or eos)"


def token_bytes_of(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """UTF-8 bytes of ``text`` behind each token: token i covers characters [start_i, start_{i+1}) (the first
    from 0, the last to the end), so the tokens of a document cover its bytes exactly once."""
    n = len(text)
    starts, last = [], 0
    for i, (s, _) in enumerate(offsets):
        last = 0 if i == 0 else min(n, max(last, s))
        starts.append(last)
    bounds = starts + [n]
    if text.isascii():
        return [bounds[i + 1] - bounds[i] for i in range(len(starts))]
    byte_at = [0] * (n + 1)
    for i, ch in enumerate(text):
        byte_at[i + 1] = byte_at[i] + len(ch.encode("utf-8", errors="replace"))
    return [byte_at[bounds[i + 1]] - byte_at[bounds[i]] for i in range(len(starts))]


def tokenize_documents(tokenizer, docs: list[tuple[str, bytes]], sep: Optional[int],
                       min_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, bytes per token), both 1-D int64: [sep] + doc tokens for documents in order, until at least
    ``min_tokens`` tokens (or all documents). The separator covers 0 bytes."""
    from transformers.utils import logging as hf_logging

    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer: bits per byte need its "
                          "character offsets (install `tokenizers`, or convert the tokenizer)")
    ids: list[int] = []
    nbytes: list[int] = []
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "sequence longer than model_max_length": we cut windows ourselves
    try:
        for name, raw in docs:
            text = raw.decode("utf-8", errors="replace")
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            counts = token_bytes_of(text, enc["offset_mapping"])
            if sum(counts) != len(text.encode("utf-8")) and enc["input_ids"]:
                raise DataError(f"token offsets of document {name!r} do not cover its text")
            if sep is not None:
                ids.append(sep)
                nbytes.append(0)
            ids.extend(enc["input_ids"])
            nbytes.extend(counts)
            if len(ids) >= min_tokens:
                break
    finally:
        hf_logging.set_verbosity(verbosity)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(nbytes, dtype=torch.int64)


# ---- the eval command -------------------------------------------------------------------------------------

def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]+", "-", name).strip("-") or "model"


def _open_store(out: Path, run_meta: dict, fresh: bool, identity_keys: tuple[str, ...]):
    from posenc_bench.bench.records import ResultsStore, read_results

    path = out / "results.json"
    if fresh and path.exists():
        path.unlink()
    if not path.exists():
        return ResultsStore(path, run_meta)
    old = read_results(path)
    for key in identity_keys:
        if old["run"].get(key) != run_meta.get(key):
            raise ConfigError(
                f"{path} holds other results (its {key!r} is {old['run'].get(key)!r}, now {run_meta.get(key)!r}); "
                "use another --out, or --fresh to start over"
            )
    run_meta["rows"] = list(dict.fromkeys(old["run"].get("rows", []) + run_meta["rows"]))
    return ResultsStore(path, run_meta, old["records"])


def _eval_key(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_eval(opts: EvalOptions, log: Callable[[str], None] = print) -> Path:
    """Evaluate ``opts.model``; returns the output folder (results.json, results.csv, table.md)."""
    spec = resolve_model(opts.model)
    if spec.kind == "checkpoint":
        return eval_checkpoint(spec, opts, log)
    return eval_hf(spec, opts, log)


def _finish(store, out: Path) -> Path:
    from posenc_bench.analysis.report import results_csv, results_markdown
    from posenc_bench.bench.records import atomic_write_text

    data = store.as_dict()
    atomic_write_text(out / "results.csv", results_csv(data))
    atomic_write_text(out / "table.md", results_markdown(data))
    return out


def _summary(row: str, records: list[dict]) -> str:
    return f"  {row}: ppl " + ", ".join(
        f"{r['eval_len']}: {r['ppl']:.3f}" if r["status"] == "ok" else f"{r['eval_len']}: {r['status']}" for r in records
    )


def eval_hf(spec: ModelSpec, opts: EvalOptions, log: Callable[[str], None] = print) -> Path:
    from posenc_bench.bench.config import DEFAULT_EVAL_LENS, parse_eval_lens
    from posenc_bench.data import eval_segments, load_corpus, tokens_fingerprint
    from posenc_bench.bench.evaluate import evaluate_length, segment_length
    from posenc_bench.bench.sweep import device_description, git_commit, resolve_device, versions

    device = resolve_device(opts.device)
    if opts.train_len is not None and opts.train_len < 1:
        raise ConfigError(f"--train-len must be >= 1, got {opts.train_len}")
    eval_tokens = opts.eval_tokens or DEFAULT_EVAL_TOKENS
    if eval_tokens < 1:
        raise ConfigError(f"--eval-tokens must be >= 1, got {eval_tokens}")
    corpus = load_corpus(opts.data or "stdlib")
    t0 = time.perf_counter()
    hf = HFModel(spec, device=device, dtype=opts.dtype, trust_remote_code=opts.trust_remote_code)
    own_len, len_source = hf.own_train_len()
    train_len = opts.train_len or own_len
    if opts.train_len:
        len_source = f"--train-len (the model's own: {own_len} from {len_source})"
    lengths = parse_eval_lens(opts.eval_lens or list(DEFAULT_EVAL_LENS), train_len)
    S = segment_length(lengths)
    sep, sep_how = document_separator(hf.tokenizer, opts.doc_sep)
    n_segments = -(-eval_tokens // S)
    tokens, nbytes = tokenize_documents(hf.tokenizer, corpus.splits["test"], sep, n_segments * S + 1)
    segments = eval_segments(tokens, S, eval_tokens)
    seg_bytes = eval_segments(nbytes, S, eval_tokens)
    load_s = time.perf_counter() - t0
    model_info = hf.describe()
    row = f"hf:{spec.name}"
    rows = [row] + [f"{row}+{s}" for s in opts.rope_scaling]
    eval_ident = {"model": {k: model_info.get(k) for k in ("ref", "gguf_file", "dtype", "file_sha256", "files_sha256", "hub_commit")},
                  "train_len": train_len, "lengths": lengths, "corpus": corpus.fingerprint,
                  "eval_fingerprint": tokens_fingerprint(segments), "doc_sep": sep, "buckets": 64}
    run_meta = {
        "kind": "eval",
        "model": model_info,
        "train_len": train_len,
        "train_len_source": len_source,
        "rows": rows,
        "eval_lengths": lengths,
        "segment_len": S,
        "eval_tokens": int(segments.shape[0] * S),
        "eval_bytes": int(seg_bytes[:, 1:].sum()),
        "eval_fingerprint": tokens_fingerprint(segments),
        "doc_separator": sep_how,
        "corpus": corpus.describe(),
        "config": {"data": {"source": corpus.source}, "eval": {"tokens": eval_tokens, "lens": opts.eval_lens,
                   "split": "test", "position_buckets": 64}, "rope_scaling": list(opts.rope_scaling),
                   "seeds": [0]},
        "params": model_info["params"],
        "versions": {**versions(), **{p: _version(p) for p in ("tokenizers", "gguf", "accelerate")}},
        "device": device_description(device),
        "git_commit": git_commit(),
        "load_time_s": round(load_s, 2),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out = Path(opts.out or f"results/eval-{_slug(spec.name)}")
    store = _open_store(out, run_meta, opts.fresh, ("kind", "model", "eval_fingerprint", "eval_lengths", "train_len"))
    store.save()
    log(f"posenc-bench eval: {row} ({model_info['class']}, {model_info['params']:,} parameters, {opts.dtype}), "
        f"train length {train_len} from {len_source}; lengths {lengths}; {run_meta['eval_tokens']:,} target tokens "
        f"({run_meta['eval_bytes']:,} bytes) each; device {run_meta['device']}; out {out}")
    rope_problem = hf.rope_problem()
    limit = hf.position_limit()
    key = _eval_key(eval_ident)
    unscaled: dict[int, dict] = {}  # length -> the unscaled row's result (reused where a scaling is the identity)
    for r, scaling in zip(rows, [None] + list(opts.rope_scaling)):
        done = store.cell(r, 0)
        if done and {d["eval_len"] for d in done} >= set(lengths) and all(d.get("eval_key") == key for d in done):
            log(f"  {r}: done before, skipped")
            if scaling is None:
                unscaled.update({d["eval_len"]: d for d in done if d["status"] == "ok"})
            continue
        records = []
        for L in lengths:
            factor = max(1.0, L / train_len)
            rec = {
                "encoding": r, "base_encoding": row, "scaling": scaling, "window": None, "seed": 0,
                "train_len": train_len, "eval_len": L, "ratio": L / train_len, "status": "ok", "reason": "",
                "ppl": None, "bpb": None, "loss": None, "tokens": None, "rope_parameters": None,
                "eval_key": key, "corpus_fingerprint": corpus.fingerprint, "eval_fingerprint": run_meta["eval_fingerprint"],
                "git_commit": run_meta["git_commit"], "device": run_meta["device"], "versions": run_meta["versions"],
                "model": {k: model_info.get(k) for k in ("ref", "gguf_file", "file_sha256", "files_sha256", "hub_commit", "dtype")},
            }
            if scaling is not None and rope_problem:
                rec.update(status="n/a", reason=rope_problem)
            elif limit is not None and L > limit:
                rec.update(status="n/a", reason=f"{model_info['class']} has an absolute position table of {limit} "
                                                 f"positions (max_position_embeddings): no position {limit} or later")
            if rec["status"] != "ok":
                records.append(rec)
                continue
            params = None if scaling is None else scaling_parameters(hf.rope_parameters(), scaling, factor, train_len)
            rec["rope_parameters"] = params
            try:
                with hf.scaled(params, scaled_max_positions(scaling or "", factor, train_len)):
                    if scaling is not None and L in unscaled and hf.scaling_is_identity(L):
                        res = {**unscaled[L], "eval_time_s": 0.0}  # bit-identical frequencies: the unscaled numbers
                        rec["same_as"] = row
                    else:
                        res = evaluate_length(None, segments, L, batch_tokens=L, buckets=64, bucket_span=max(lengths),
                                              device=device, show_progress=opts.show_progress, token_bytes=seg_bytes,
                                              nll_fn=hf.nll)
            except PosencError as e:
                rec.update(status="n/a", reason=str(e))
                records.append(rec)
                continue
            if scaling is None:
                unscaled[L] = res
            rec.update({k: res[k] for k in ("ppl", "bpb", "loss", "tokens", "bytes", "loss_by_position", "eval_time_s")})
            records.append(rec)
        log(_summary(r, records))
        store.put_cell(r, 0, records)
    _finish(store, out)
    log(f"wrote {out}/results.json, results.csv, table.md")
    return out


def _version(pkg: str) -> Optional[str]:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


# ---- our own checkpoints ----------------------------------------------------------------------------------

def eval_checkpoint(spec: ModelSpec, opts: EvalOptions, log: Callable[[str], None] = print) -> Path:
    """A checkpoint written by `posenc-bench run`, evaluated exactly as `run` evaluates it (byte tokens, its
    config's lengths, tokens and batch size unless overridden). ``--rope-scaling X`` evaluates the registered
    eval-only variant ``<encoding>-X`` of the trained encoding, where there is one."""
    from safetensors.torch import load_model

    from posenc_bench import encodings
    from posenc_bench.bench.config import RunConfig, _from_dict, eval_key, row_name, validate
    from posenc_bench.data import eval_segments, load_corpus, tokens_fingerprint
    from posenc_bench.bench.evaluate import segment_length
    from posenc_bench.model.transformer import DecoderLM
    from posenc_bench.bench.sweep import device_description, evaluate_into, git_commit, resolve_device, versions

    path = Path(spec.ref)
    try:
        meta = json.loads((path / "config.json").read_text())
        cfg_dict, trained, window, seed = meta["config"], meta["encoding"], meta["window"], meta["seed"]
    except (json.JSONDecodeError, KeyError) as e:
        raise ConfigError(f"{str(path / 'config.json')!r} is not a posenc-bench checkpoint config: {e}") from None
    if opts.dtype != "float32":
        raise ConfigError("--dtype applies to Hugging Face models; a checkpoint runs at its config's precision")
    cfg: RunConfig = _from_dict(RunConfig, cfg_dict, "")
    if opts.train_len is not None and opts.train_len != cfg.train.train_len:
        raise ConfigError(f"--train-len {opts.train_len}: this checkpoint was trained at {cfg.train.train_len} tokens")
    if opts.eval_lens is not None:
        cfg.eval.lens = list(opts.eval_lens)
    if opts.eval_tokens is not None:
        cfg.eval.tokens = opts.eval_tokens
    if opts.data is not None:
        cfg.data.source = opts.data
    cfg.device = opts.device
    validate(cfg)
    device = resolve_device(cfg.device)
    autocast = {"fp32": None, "bf16": torch.bfloat16}[cfg.precision]
    lengths = cfg.eval_lengths()
    corpus = load_corpus(cfg.data.source, valid_fraction=cfg.data.valid_fraction,
                         test_fraction=cfg.data.test_fraction, text_field=cfg.data.text_field)
    if corpus.fingerprint != meta.get("corpus_fingerprint"):
        log(f"  note: corpus {cfg.data.source!r} ({corpus.fingerprint}) is not the one this model was trained on "
            f"({meta.get('corpus_fingerprint')})")
    S = segment_length(lengths)
    segments = eval_segments(corpus.stream(cfg.eval.split), S, cfg.eval.tokens)
    base_row = row_name(trained, window)
    rows: list[tuple[str, Optional[str], str]] = [(base_row, trained, "")]
    for s in opts.rope_scaling:
        variant = f"{trained}-{s}"
        known = variant in encodings.available() and encodings.get_class(variant).trained_as == trained
        rows.append((row_name(variant, window), variant if known else None,
                     "" if known else f"no registered encoding {variant!r} evaluates the trained {trained!r} model "
                                      f"(registered: {', '.join(encodings.available())})"))
    run_meta = {
        "kind": "eval",
        "model": {"kind": "checkpoint", "path": str(path), "encoding": trained, "window": window, "seed": seed,
                  "cell_key": meta.get("cell_key"), "weights_sha256": file_hash([path / "model.safetensors"])},
        "config": cfg.to_dict(), "rows": [r for r, _, _ in rows], "eval_lengths": lengths, "segment_len": S,
        "eval_tokens": int(segments.shape[0] * S), "eval_fingerprint": tokens_fingerprint(segments),
        "corpus": corpus.describe(), "params": sum(p.numel() for p in DecoderLM(cfg.model, "nope", cfg.train.train_len).parameters()),
        "versions": versions(), "device": device_description(device), "git_commit": git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out = Path(opts.out or f"results/eval-{_slug(path.parent.parent.name + '-' + path.name)}")
    store = _open_store(out, run_meta, opts.fresh, ("kind", "eval_fingerprint", "eval_lengths"))
    store.save()
    log(f"posenc-bench eval: checkpoint {path} ({base_row}, seed {seed}); lengths {lengths}; "
        f"{run_meta['eval_tokens']:,} target tokens each; device {run_meta['device']}; out {out}")
    ekey = eval_key(cfg)
    outcome = meta.get("outcome", {})
    for r, name, reason in rows:
        records = []
        model = None
        if name is not None:
            model = DecoderLM(cfg.model, name, cfg.train.train_len, window=window, seed=seed,
                              max_mask_bytes=cfg.max_mask_bytes)
            load_model(model, str(path / "model.safetensors"))
            if meta.get("finetune"):  # a -ft row's checkpoint: its scaling is fixed at the fine-tune length
                model.encoding.set_train_length(meta["finetune"]["len"])
            model = model.to(device).eval()
        for L in lengths:
            rec = {
                "encoding": r, "base_encoding": name or f"{trained}-?", "window": window, "seed": seed,
                "train_len": cfg.train.train_len, "eval_len": L, "ratio": L / cfg.train.train_len,
                "status": "ok", "reason": reason, "ppl": None, "bpb": None, "loss": None, "tokens": None,
                "train_time_s": outcome.get("time_s"), "train_final_loss": outcome.get("final_loss"),
                "train_curve": outcome.get("curve"), "cell_key": meta.get("cell_key"), "eval_key": ekey,
                "corpus_fingerprint": corpus.fingerprint, "eval_fingerprint": run_meta["eval_fingerprint"],
                "git_commit": run_meta["git_commit"], "device": run_meta["device"], "versions": run_meta["versions"],
                "config": cfg.to_dict(), "checkpoint": str(path),
            }
            if model is None:
                rec["status"] = "n/a"
                records.append(rec)
                continue
            records.append(evaluate_into(rec, model, segments, L, cfg, bucket_span=max(lengths), device=device,
                                         autocast=autocast, show_progress=opts.show_progress))
        log(_summary(r, records))
        store.put_cell(r, seed, records)
    _finish(store, out)
    log(f"wrote {out}/results.json, results.csv, table.md")
    return out
