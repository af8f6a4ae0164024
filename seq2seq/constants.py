"""Special token ids shared by the tokenizer, batching, model and search."""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# Beam sizes beyond this cost time and memory for no gain in NMT (quality peaks at 5-10).
MAX_BEAM = 64

# Padded source subwords per decoding batch (before beam expansion): the default of every
# decoding path (evaluate, translate's file mode, the server, the Python API). With
# workers=auto on 2 cores, 4,000 was no faster than this (docs/performance.md#decoding).
DECODE_BATCH_TOKENS = 2000
