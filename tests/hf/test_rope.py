"""RoPE scalings of a Hugging Face model (hf/rope.py): the parameters of each are what transformers itself
computes for that config, and which rows a Hugging Face model accepts."""

import math

import pytest
import torch

from posenc_bench.hf import model as hf
from posenc_bench.hf import rope as hf_rope


@pytest.mark.parametrize("scaling", hf_rope.SCALINGS)
def test_scaling_is_what_transformers_computes_for_that_config(llama_dir, scaling):
    """Our swapped rotary module has transformers' frequencies, and the model gives the logits of a model
    built by transformers with that rope_parameters config from the start."""
    from transformers import LlamaForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = hf.HFModel(hf.resolve_model(f"hf:{llama_dir}"), device=torch.device("cpu"))
    train_len, L = 32, 128
    factor = L / train_len
    params = hf_rope.scaling_parameters(model.rope_parameters(), scaling, factor, train_len)
    mpe = hf_rope.scaled_max_positions(scaling, factor, train_len)
    reference = LlamaForCausalLM.from_pretrained(llama_dir, rope_parameters=dict(params), max_position_embeddings=mpe).eval()
    assert reference.config.rope_parameters["rope_type"] == scaling
    expected_inv_freq, expected_scale = ROPE_INIT_FUNCTIONS[scaling](reference.config, "cpu")
    default_inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)  # head_dim 8
    x = torch.randint(0, 300, (1, L), generator=torch.Generator().manual_seed(0))
    with model.scaled(params, mpe), torch.no_grad():
        (rotary,) = model.rotary_modules()
        if scaling == "dynamic":  # frequencies are the default ones until a forward pass passes the train length
            torch.testing.assert_close(rotary.inv_freq, default_inv_freq, rtol=1e-6, atol=0)
        else:
            torch.testing.assert_close(rotary.inv_freq, expected_inv_freq, rtol=0, atol=0)
            assert rotary.attention_scaling == expected_scale
        ours = model.model(x).logits
        theirs = reference(x).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        if scaling == "dynamic":  # NTK base for seq_len L: base * (factor * L / T - (factor - 1)) ** (d / (d - 2))
            base = 10000.0 * (factor * L / train_len - (factor - 1)) ** (8 / 6)
            torch.testing.assert_close(rotary.inv_freq, 1.0 / base ** (torch.arange(0, 8, 2).float() / 8))
    if scaling == "linear":
        torch.testing.assert_close(expected_inv_freq, default_inv_freq / 4)
    if scaling == "yarn":
        assert expected_scale == pytest.approx(0.1 * math.log(4) + 1)  # the paper's sqrt(1/t)
    (restored,) = model.rotary_modules()
    assert restored.rope_type == "default"  # the original module is back after the block
    torch.testing.assert_close(restored.inv_freq, default_inv_freq)
