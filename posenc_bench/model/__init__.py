"""The transformer the encodings plug into: transformer.py (config, layers, DecoderLM), plan.py (the path a
forward takes, its chunks and masks), attention.py (runs the plan's path), explicit.py (the encoding's own
logits), sinks.py (attention sinks), distance_bias.py (a learned distance bias's training path)."""
