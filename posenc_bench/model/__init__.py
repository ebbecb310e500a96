"""The transformer the encodings plug into: transformer.py (config, layers, DecoderLM), attention.py (the path
a forward takes, its chunks and masks), explicit.py (the encoding's own logits), sinks.py (attention sinks),
distance_bias.py (a learned distance bias's training path)."""
