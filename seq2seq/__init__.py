"""seq2seq: RNN encoder-decoder NMT with pluggable attention."""

__version__ = "0.1.0"
