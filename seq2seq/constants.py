"""Special token ids shared by the tokenizer, batching, model and search."""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
