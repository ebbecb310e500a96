"""``RunConfig``: one run's whole config, its sections (``model``, ``train``, ``data``, ``eval``, ``gate``,
``finetune``, ``task``) and the settings of the run itself (rows, seeds, device, output folder, the time it is
expected to take); what it derives (eval lengths, the fine-tuning plan, the cells) and ``validate``, which
checks it section by section."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from posenc_bench import encodings
from posenc_bench.bench.config.data import DataConfig, validate_data
from posenc_bench.bench.config.eval import EvalConfig, validate_eval
from posenc_bench.bench.config.finetune import FinetuneConfig, FinetunePlan, finetune_plan, validate_finetune
from posenc_bench.bench.config.gate import GateConfig, validate_gate
from posenc_bench.bench.config.model import validate_encoding_options, validate_rows, validate_sizes, validate_vocabulary
from posenc_bench.bench.config.task import TaskConfig
from posenc_bench.bench.config.train import TrainConfig, validate_train
from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError
from posenc_bench.model.plan import MAX_MASK_BYTES
from posenc_bench.model.transformer import ModelConfig
from posenc_bench.values import TRAIN_PRECISIONS, parse_eval_lens


@dataclass
class RunConfig:
    encodings: list = field(default_factory=lambda: ["sinusoidal", "learned", "t5", "rope", "rope-linear", "alibi", "nope"])
    window: Optional[int] = None  # sliding-window attention for every encoding (rows named <enc>+sw<W>)
    seeds: list = field(default_factory=lambda: [0])
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: Optional[int] = None  # torch intra-op threads; None keeps torch's default
    precision: str = "fp32"  # fp32 | bf16 (autocast; for GPUs)
    out: str = "results/run"
    max_mask_bytes: int = MAX_MASK_BYTES  # memory budget of the attention masks (model/plan.py)
    save_every: int = 100  # training steps between resumable mid-run saves (0: only at the end)
    # seconds of training between those saves, whichever of the two comes first (0: steps only): at 25 s a step,
    # 100 steps are 40 minutes of work to lose; by default at most 10 minutes is ever lost
    save_every_s: float = 600.0
    plugins: list = field(default_factory=list)  # modules imported first, e.g. your package's @register encodings
    # micro-batches per step and process: train.batch_size stays the global batch (how the work is cut, like
    # device and threads: not part of a cell's identity; the loss is the mean over the global batch either way)
    grad_accum: int = 1
    expected_sweep_s: Optional[float] = None
    """Seconds the whole sweep of this config takes on the machine it was sized on: the wall-clock time of
    ``posenc-bench run --config NAME`` from an empty results folder (every model trained, every cell evaluated)
    on 2 CPU cores, measured when the config was sized and rounded as its header comment says it ("about 10
    minutes"). The reference of the run's time estimate (``bench/train/eta.py``): an estimate beyond 3x it gets a
    note with what brings the sweep under that. None: the config states no time (on a CPU the note then comes
    past an hour). Changes no number: not part of a result's identity (``records.NOT_IDENTITY``) or any key."""
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
        return finetune_plan(self.finetune, self.train, self.eval_lengths())

    def cells(self) -> list[tuple[Row, int]]:
        """(row, seed) for every cell of the sweep, in a stable order."""
        return [(row, seed) for row in self.rows() for seed in self.seeds]

    def rows(self) -> list[Row]:
        """The rows of ``encodings``, each with the config's window unless its name gives one."""
        return list(dict.fromkeys(self.row(spec) for spec in self.encodings))

    def row(self, spec: str) -> Row:
        """The row named ``spec`` (ConfigError when it is none), with the config's window unless its name gives one."""
        row = Row.parse(spec)
        return row if row.window is not None else Row(row.encoding, self.window)

    def to_dict(self) -> dict:
        return asdict(self)


def validate(cfg: RunConfig) -> None:
    """ConfigError naming the first key, in this order, whose value the run cannot take: the run's own
    settings and the model, then each section."""
    if not cfg.encodings:
        raise ConfigError(f"no encodings selected; valid encodings: {', '.join(encodings.available())}")
    if cfg.precision not in TRAIN_PRECISIONS:
        raise ConfigError(f"precision {cfg.precision!r} is not supported; valid: {', '.join(TRAIN_PRECISIONS)}")
    validate_encoding_options(cfg.model)
    if cfg.window is not None and cfg.window < 1:
        raise ConfigError(f"window must be >= 1 token, got {cfg.window}")
    if cfg.save_every < 0:
        raise ConfigError(f"save_every must be >= 0 steps (0 = only at the end), got {cfg.save_every}")
    if not (cfg.save_every_s >= 0 and math.isfinite(cfg.save_every_s)):
        raise ConfigError(f"save_every_s must be >= 0 seconds (0 = by steps only), got {cfg.save_every_s}")
    if cfg.grad_accum < 1 or cfg.train.batch_size % cfg.grad_accum:
        raise ConfigError(f"grad_accum must be >= 1 and divide train.batch_size {cfg.train.batch_size}, got {cfg.grad_accum}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ConfigError(f"threads must be >= 1, got {cfg.threads}")
    if cfg.max_mask_bytes < 1:
        raise ConfigError(f"max_mask_bytes must be >= 1 byte, got {cfg.max_mask_bytes}")
    if cfg.expected_sweep_s is not None and not cfg.expected_sweep_s > 0:
        raise ConfigError(f"expected_sweep_s must be a positive number of seconds (or absent), got {cfg.expected_sweep_s}")
    validate_sizes(cfg.model)
    validate_vocabulary(cfg.model, cfg.data.tokenizer)
    validate_train(cfg.train)  # before the rows: an encoding is built with the train length
    validate_rows(cfg.model, cfg.encodings, cfg.window, cfg.train.train_len)
    if not cfg.seeds or any(not isinstance(s, int) or s < 0 for s in cfg.seeds):
        raise ConfigError(f"seeds must be non-negative integers, got {cfg.seeds!r}")
    validate_eval(cfg.eval)
    validate_data(cfg.data)
    cfg.eval_lengths()  # raises on a bad length
    validate_finetune(cfg.finetune)
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
    keys = cfg.eval.key_tokens
    if keys.evaluator:  # a row the config can build (trained with the run if it is not one of this invocation's)
        if cfg.task.name:
            raise ConfigError(f"eval.key_tokens: key tokens are targets of text; a task run (task.name "
                              f"{cfg.task.name}) has none")
        cfg.row(keys.evaluator)  # ConfigError naming an unknown encoding
        # any seed: a table made as several sweeps of one config (seeds 0-2, then 3-4) names one evaluator model
        # in each, whose key tokens the later sweeps take from the first's folder (key_tokens.pt)
        if keys.seed is not None and keys.seed < 0:
            raise ConfigError(f"eval.key_tokens.seed {keys.seed}: a seed is 0 or more (default: the run's first)")
