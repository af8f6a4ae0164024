"""The model: embeddings, a (bidirectional) RNN encoder, one decoder and a pluggable attention.

Read :mod:`seq2seq.model.reference` first: the whole model in plain torch, written to be
read. :mod:`seq2seq.model.fast` is the same model (same parameters, same numbers) with the
speed-ups that training uses by default. Nothing here imports corpus, training or
command-line code.
"""

from seq2seq.model.build import build_model, count_parameters

__all__ = ["build_model", "count_parameters"]
