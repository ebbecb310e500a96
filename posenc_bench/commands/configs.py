"""posenc-bench configs: the built-in configs (every configs/*.yaml), with their purpose and cost."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    return sub.add_parser("configs", help="built-in configs for --config NAME: purpose and estimated cost")


def first_sentence(text: str) -> str:
    head, sep, _ = text.partition(". ")
    return head + "." if sep else text


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.bench.train import eta
    from posenc_bench.bench.config import builtin_configs, config_header, load_config

    configs = builtin_configs()
    width = max(map(len, configs), default=0)
    for name, path in configs.items():
        header, cfg = config_header(path), load_config(name)
        stated = cfg.expected_sweep_s  # the time its comment states, as a field (tests/bench/train/test_eta.py)
        print(f"{name:<{width}}  {first_sentence(header) or '(no comment)'}")
        print(f"{'':<{width}}  cost: {eta.cost_line(cfg)}"
              + (f"; its comment states ~{eta.duration(stated)}" if stated else ""))
    print(f"\nuse: posenc-bench run --config NAME (or a YAML file); files in {next(iter(configs.values())).parent}"
          if configs else "no built-in configs found")
    return 0
