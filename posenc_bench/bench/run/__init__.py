"""The runtime room: device, precision and progress as one object; torchrun processes; shards of a sweep and their merge."""
