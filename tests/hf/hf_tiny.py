"""Tiny Hugging Face models and a tokenizer built offline; the session fixtures of tests/conftest.py use them."""

from pathlib import Path

import torch


def train_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (GPT-2 style) trained on a few standard-library files, with <s> and </s>."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / name).read_text() for name in ("abc.py", "bisect.py", "heapq.py", "colorsys.py")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def save_llama(path: Path, tokenizer, max_positions: int = 32, seed: int = 0, **rope) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      tie_word_embeddings=False, initializer_range=0.3, **rope)  # peaked, not near-uniform
    LlamaForCausalLM(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_gpt2(path: Path, tokenizer, max_positions: int = 32, seed: int = 0) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=max_positions, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
