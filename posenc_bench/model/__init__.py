"""The transformer the encodings plug into: transformer.py (config, layers, DecoderLM), attention.py (how
SDPA runs), distance_bias.py (a learned distance bias's training path)."""
