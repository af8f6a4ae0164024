"""Experiments: the one-command reproduction, its criteria and report, results across seeds,
and the training curves of the length effect."""
