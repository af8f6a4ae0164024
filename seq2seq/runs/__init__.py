"""A run on disk: the run folder, its checkpoints, logs, TensorBoard events and averaging."""
