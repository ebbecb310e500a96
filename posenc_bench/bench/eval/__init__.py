"""The evaluation room: the perplexity protocol (same targets at every length), its memory probe, evaluation of pretrained models and checkpoints, and passkey retrieval."""
