"""What the training loop measures on dev: loss, and greedy translations scored by length.

At every validation the loop computes the dev cross-entropy over all of dev and
translates a sample of dev (``train.valid_bleu_sentences`` pairs, spread evenly over the
split) greedily. The translations are scored overall (the BLEU that picks ``best.pt``) and
per source-length bucket (:func:`seq2seq.evaluation.metrics.quick_bucket_scores`), so the run folder's
``dev_buckets.csv`` shows when a model's long-sentence quality pulls away from its
short-sentence quality during training, not only at the end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from seq2seq.corpus import batching
from seq2seq.evaluation.metrics import quick_bucket_scores
from seq2seq.inference.search import greedy
from seq2seq.runs.tensorboard import AttentionSample, sample_indices


def to_device(batch: batching.Batch, device: torch.device) -> batching.Batch:
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch


def bleu_sample(valid_idx: np.ndarray, n: int) -> np.ndarray:
    """``n`` dev pairs spread evenly over the split (dev is in text order, so the first
    ``n`` would all come from the first books). All of dev when ``n >= len(valid_idx)``."""
    if n >= len(valid_idx):
        return valid_idx
    picks = np.unique(np.linspace(0, len(valid_idx) - 1, n).round().astype(np.int64))
    return valid_idx[picks]


@torch.no_grad()
def dev_loss(model: torch.nn.Module, data: batching.TrainingData, batch_tokens: int,
             device: torch.device, autocast: Any) -> float:
    """Mean per-token dev cross-entropy (no label smoothing, so exp() is the perplexity)."""
    total, tokens = 0.0, 0
    for idx in batching.eval_batches(data.valid, data.valid_idx, batch_tokens):
        batch = to_device(batching.collate(data.valid, idx), device)
        with autocast():
            total += float(model(batch.src, batch.src_lens, batch.tgt_in, targets=batch.tgt_out))
        tokens += batch.n_tgt_tokens
    return total / max(tokens, 1)


@torch.no_grad()
def dev_translations(model: torch.nn.Module, data: batching.TrainingData, tokenizers: Any,
                     chosen: np.ndarray, batch_tokens: int, device: torch.device,
                     autocast: Any) -> list[str]:
    """Greedy detokenized translations of the dev pairs ``chosen``, in that order."""
    hyps: dict[int, str] = {}
    for idx in batching.eval_batches(data.valid, chosen, batch_tokens):
        batch = to_device(batching.collate(data.valid, idx), device)
        with autocast():
            out = greedy(model, batch.src, batch.src_lens)
        for i, hyp in zip(batch.ids.tolist(), out, strict=True):
            hyps[i] = tokenizers.tgt.decode(hyp.tokens)
    return [hyps[int(i)] for i in chosen]


def dev_scores(model: torch.nn.Module, data: batching.TrainingData, tokenizers: Any,
               n_bleu: int, batch_tokens: int, device: torch.device,
               autocast: Any) -> tuple[float, list[dict[str, Any]]]:
    """(dev loss, bucket rows); the rows are empty when dev BLEU is off (``n_bleu == 0``).

    The model is in eval mode meanwhile. Rows are those of
    :func:`~seq2seq.evaluation.metrics.quick_bucket_scores`; the last one (``all``) is the dev BLEU.
    """
    model.eval()
    try:
        loss = dev_loss(model, data, batch_tokens, device, autocast)
        rows: list[dict[str, Any]] = []
        if n_bleu > 0:
            chosen = bleu_sample(data.valid_idx, n_bleu)
            hyps = dev_translations(model, data, tokenizers, chosen, batch_tokens, device, autocast)
            refs = [data.valid_refs[int(i)] for i in chosen]
            rows = quick_bucket_scores(data.valid.src_words[chosen].tolist(), hyps, refs)
    finally:
        model.train()
    return loss, rows


def overall_bleu(rows: list[dict[str, Any]]) -> float:
    """The ``all`` row's BLEU, NaN when dev BLEU is off."""
    return next((r["bleu"] for r in rows if r["bucket"] == "all"), math.nan)


@torch.no_grad()
def attention_samples(model: torch.nn.Module, data: batching.TrainingData, tokenizers: Any,
                      device: torch.device) -> list[AttentionSample]:
    """Greedy translations of the fixed dev sentences of :func:`seq2seq.runs.tensorboard.sample_indices`
    with their attention (fp32); [] for a model whose weights are all zero (``none``)."""
    samples = []
    model.eval()
    try:
        for label, i in sample_indices(data.valid.src_words, data.valid_idx).items():
            batch = to_device(batching.collate(data.valid, np.array([i])), device)
            [hyp] = greedy(model, batch.src, batch.src_lens)
            if not bool(hyp.attention.any()):
                continue
            samples.append(AttentionSample(
                label, hyp.attention.float().numpy(),
                [tokenizers.src.id_to_piece(t) for t in data.valid.src(i).tolist()],
                [tokenizers.tgt.id_to_piece(t) for t in hyp.tokens]))
    finally:
        model.train()
    return samples
