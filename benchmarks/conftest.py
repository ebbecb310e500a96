"""Benchmark sizes: full sizes under --benchmark-only / --benchmark-json; tiny ones when timing is off.

`pytest benchmarks -q --benchmark-disable` (the CI smoke) runs every benchmark once as a plain test at small
sizes, so the suite cannot rot and stays fast; POSENC_BENCH_FAST=1 forces the small sizes.
"""

import os

import pytest
import torch

FULL_LENGTHS = [2048, 8192]
FAST_LENGTHS = [64]


def fast_mode(config) -> bool:
    return bool(os.environ.get("POSENC_BENCH_FAST")) or bool(config.getoption("benchmark_disable", False))


def pytest_generate_tests(metafunc):
    if "gen_length" in metafunc.fixturenames:
        metafunc.parametrize("gen_length", FAST_LENGTHS if fast_mode(metafunc.config) else FULL_LENGTHS + [5000])
    if "attn_length" in metafunc.fixturenames:
        metafunc.parametrize("attn_length", FAST_LENGTHS if fast_mode(metafunc.config) else FULL_LENGTHS)


@pytest.fixture
def fast(request) -> bool:
    return fast_mode(request.config)


@pytest.fixture(autouse=True)
def two_threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))
