"""Hugging Face models for the protocol: loading (model.py), tokenising with byte counts (tokenize.py), RoPE
surgery (rope.py)."""
