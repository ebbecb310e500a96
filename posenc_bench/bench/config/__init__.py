"""A run's config: dataclasses by section <- YAML file (configs/*.yaml) <- CLI flags.

One module per section, each with its dataclass and its checks: ``train.py``, ``data.py`` (and
``load_run_corpus``), ``eval.py``, ``finetune.py`` (and the resolved ``FinetunePlan``), ``task.py``,
``gate.py``; ``model.py`` checks the model section (``ModelConfig`` is the model's own,
``model/transformer.py``); ``run.py`` holds ``RunConfig``, the whole config, and ``validate``; ``load.py``
reads YAML files and built-in configs by name, applies ``--set`` overrides and validates (``load_config``).
Every name is importable from here, ``from posenc_bench.bench.config import load_config``.
"""

from posenc_bench.bench.config.data import DataConfig, load_run_corpus
from posenc_bench.bench.config.eval import DEFAULT_EVAL_LENS, EvalConfig
from posenc_bench.bench.config.finetune import FinetuneConfig, FinetunePlan, finetune_plan
from posenc_bench.bench.config.gate import GATE_TOLERANCE_KEYS, GateConfig, validate_gate
from posenc_bench.bench.config.load import (BUILTIN_CONFIGS, build_config, builtin_configs, config_from_dict,
                                            config_header, file_encodings, import_plugins, load_config, read_config,
                                            resolve_config, set_key)
from posenc_bench.bench.config.run import RunConfig, validate, validate_rows_and_task
from posenc_bench.bench.config.task import TaskConfig
from posenc_bench.bench.config.train import TrainConfig
from posenc_bench.model.transformer import ModelConfig
from posenc_bench.values import parse_eval_lens  # its old home was this module

__all__ = ["BUILTIN_CONFIGS", "DEFAULT_EVAL_LENS", "GATE_TOLERANCE_KEYS", "DataConfig", "EvalConfig", "FinetuneConfig",
           "FinetunePlan", "GateConfig", "ModelConfig", "RunConfig", "TaskConfig", "TrainConfig", "build_config",
           "builtin_configs", "config_from_dict", "config_header", "file_encodings", "finetune_plan",
           "import_plugins", "load_config", "load_run_corpus", "parse_eval_lens", "read_config", "resolve_config",
           "set_key", "validate", "validate_gate", "validate_rows_and_task"]
