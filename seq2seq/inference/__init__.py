"""Inference: greedy and beam search, the one batched decoding path, the Translator API,
file translation, ensembles, the interactive prompt and attention heatmaps."""
