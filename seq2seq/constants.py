"""Special token ids shared by the tokenizer, batching, model and search."""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# Beam sizes beyond this cost time and memory for no gain in NMT (quality peaks at 5-10).
MAX_BEAM = 64
