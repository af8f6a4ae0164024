"""Evaluation: BLEU and chrF by source-length bucket with bootstrap tests, the
`seq2seq-evaluate` command, result tables and the Apertium reference row."""
