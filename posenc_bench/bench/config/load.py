"""One config path: dataclasses <- YAML file (configs/*.yaml) <- CLI flags.

``load_config(path, overrides)`` returns a validated :class:`RunConfig`. Unknown keys and bad values raise
ConfigError naming the key or value and the valid choices. ``path`` is a file or the name of a built-in
config: every ``configs/<name>.yaml`` of the repository, shipped inside the package as
``posenc_bench/configs/`` (a symlink to ``configs/`` in the source tree, its files in a wheel), so a name
works from a clone and from an installed wheel alike. ``read_config`` and ``build_config`` are its two halves,
for a caller that looks at the file before it knows its overrides (``run --encodings -learned``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import typing
from pathlib import Path
from typing import Any, Optional

import yaml

from posenc_bench.bench.config.run import RunConfig, validate
from posenc_bench.errors import ConfigError
from posenc_bench.tokenizer import vocab_size_of
from posenc_bench.values import yaml_number

# The built-in configs: ``configs/`` of the repository (a symlink in the source tree; real files in a wheel).
BUILTIN_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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


def read_config(path: Optional[str] = None) -> dict:
    """The contents of a YAML file or built-in config (``resolve_config``), read once; {} without one (the
    built-in defaults)."""
    if path is None:
        return {}
    p = resolve_config(str(path))
    try:
        return yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {e}") from None


def build_config(data: dict, overrides: Optional[dict[str, Any]] = None) -> RunConfig:
    """The validated RunConfig of a config's contents (``read_config``; left as they are) with dotted-key
    overrides applied: the model's vocabulary follows the tokenizer, a task run's train length its task, and
    the plugins are imported before the rows are checked."""
    data = copy.deepcopy(data)
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


def load_config(path: Optional[str] = None, overrides: Optional[dict[str, Any]] = None) -> RunConfig:
    """Read a YAML file or built-in config (or the built-in defaults), apply dotted-key overrides, validate."""
    return build_config(read_config(path), overrides)


def file_encodings(data: dict) -> list:
    """The rows a config's contents (``read_config``) select before any flag, with its plugins imported so
    that a selection such as ``-my-encoding`` can name their encodings (the base of ``run --encodings``)."""
    cfg = config_from_dict(data)
    import_plugins(cfg.plugins)
    return cfg.encodings


def import_plugins(modules: list) -> None:
    """Import each named module (importable from sys.path) so its ``@register`` encodings exist."""
    for name in modules:
        try:
            importlib.import_module(str(name))
        except Exception as e:  # noqa: BLE001 - any failure to import is the same config error to the user
            raise ConfigError(f"plugin module {name!r} (config key plugins) could not be imported: "
                              f"{type(e).__name__}: {e}") from None
