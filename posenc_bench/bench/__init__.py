"""The benchmark: config and keys, checkpoints, records and the identity rule, training, evaluation, the
sweep, and the eval, passkey and timing commands' library."""
