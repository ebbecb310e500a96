"""The training room: the loop that trains one model (resumable, DDP, gradient accumulation) and the ETA of a sweep's training."""
