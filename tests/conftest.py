import json
import os

import pytest
import torch

# Tests are sized for 2 CPU cores; keep torch from oversubscribing a shared CI machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def tiny_cfg():
    from posenc_bench.model.transformer import ModelConfig

    return ModelConfig(d_model=32, n_layers=2, n_heads=4)


# ---- a tiny Hugging Face model, built offline once per session (tests/hf and tests/bench/eval/test_pretrained.py) ----

@pytest.fixture(scope="session")
def tokenizer():
    from tests.hf.hf_tiny import train_tokenizer

    return train_tokenizer()


@pytest.fixture(scope="session")
def llama_dir(tokenizer, tmp_path_factory):
    """The tiny Llama's folder (max_position_embeddings 32, seed 0), named tiny-llama: rows are hf:tiny-llama."""
    from tests.hf.hf_tiny import save_llama

    return save_llama(tmp_path_factory.mktemp("llama") / "tiny-llama", tokenizer)


@pytest.fixture(scope="session")
def hf_model(llama_dir):
    """The tiny Llama loaded as an HFModel on the CPU; tests that reroute or scale it put it back as it was."""
    from posenc_bench.hf import model as hf

    return hf.HFModel(hf.resolve_model(f"hf:{llama_dir}"), device=torch.device("cpu"))


@pytest.fixture(scope="session")
def llama_eval(llama_dir, tmp_path_factory):
    """`posenc-bench eval` of the tiny Llama at 1, 1.5 and 4x with every scaling: (results.json's data, its folder)."""
    from posenc_bench.commands.cli import main

    out = tmp_path_factory.mktemp("eval") / "out"
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,1.5,4x", "--rope-scaling", "all",
                 "--out", str(out), "--eval-tokens", "384", "--progress", "off"]) == 0
    return json.loads((out / "results.json").read_text()), out
