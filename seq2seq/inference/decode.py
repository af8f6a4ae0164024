"""Decode a list of source sentences with a trained model: batched, length-sorted, in order.

Sentences are tokenized, sorted by source length so a batch holds similar lengths
(little padding, and beam search retires sentences together), cut into batches of
about ``batch_tokens`` padded source tokens, decoded with greedy or beam search,
and put back in their original order. Each sentence also gets the mean entropy of
its attention rows (a diagnostic of how peaked the attention is) and its output
length in target tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from seq2seq.config import check_beam
from seq2seq.constants import DECODE_BATCH_TOKENS, PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.search import Hypothesis, SearchSettings, search_batch


class _SrcTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class _TgtTokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class _Tokenizers(Protocol):
    src: _SrcTokenizer
    tgt: _TgtTokenizer


@dataclass
class Decoded:
    """The decoding of a split, in the order of its sources.

    hypotheses: detokenized best hypothesis per sentence ("" for an empty source).
    entropies: mean attention entropy per sentence in nats; NaN where the weights are
        not a distribution (``none`` attention returns zeros) or the output is empty.
    lengths: output length per sentence in target tokens (EOS excluded).
    seconds: wall time of the decoding, tokenization included.
    """

    hypotheses: list[str]
    entropies: list[float]
    lengths: list[int]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: NaN entropies become None."""
        ents = [None if math.isnan(e) else e for e in self.entropies]
        return {"hypotheses": self.hypotheses, "entropies": ents,
                "lengths": self.lengths, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decoded:
        ents = [math.nan if e is None else float(e) for e in data["entropies"]]
        return cls(list(data["hypotheses"]), ents, [int(n) for n in data["lengths"]],
                   float(data["seconds"]))


def attention_entropy(weights: Tensor) -> float:
    """Mean over output steps of -sum_j a_j log a_j; weights (T_out, src_len).

    NaN where there is nothing to average or the rows do not sum to 1 (``none``).
    """
    if weights.numel() == 0:
        return math.nan
    w = weights.double()
    if not torch.allclose(w.sum(dim=-1), torch.ones(w.size(0), dtype=w.dtype), atol=1e-3):
        return math.nan
    ent = -(w * torch.log(w.clamp_min(1e-30))).sum(dim=-1)  # 0 log 0 = 0 via the clamp
    return float(ent.mean())


def length_sorted_batches(lengths: Sequence[int], batch_tokens: int) -> list[np.ndarray]:
    """Indices of non-empty sources cut into batches, longest sources first.

    A batch holds at most ``batch_tokens`` padded source tokens (rows x longest row),
    or a single sentence longer than that. Empty sources (length 0) are left out.
    """
    if batch_tokens < 1:
        raise ConfigError(f"batch_tokens={batch_tokens} must be positive")
    lens = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lens, kind="stable")
    order = order[lens[order] > 0]
    batches, start = [], 0
    for pos in range(1, len(order) + 1):
        # rows sorted longest first, so the first row sets the padded width
        if pos == len(order) or (pos + 1 - start) * lens[order[start]] > batch_tokens:
            batches.append(order[start:pos])
            start = pos
    return batches


def _pad(seqs: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """(B, S) long padded with PAD_ID and (B,) lengths."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    src = torch.full((len(seqs), int(lens.max())), PAD_ID, dtype=torch.long)
    for row, seq in enumerate(seqs):
        src[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return src.to(device), lens.to(device)


def search_batches(model: nn.Module, encoded: Sequence[list[int]], beam: int, nbest: int = 1,
                   settings: SearchSettings | None = None,
                   batch_tokens: int = DECODE_BATCH_TOKENS,
                   device: str | torch.device | None = None, workers: int = 1
                   ) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
    """The one batched decoding path of evaluation, the Translator and file translation.

    ``encoded``: source ids per sentence (no BOS/EOS). Yields, batch by batch (longest
    sources first, :func:`length_sorted_batches`), the sentence indices and per sentence
    its ``nbest`` hypotheses, best first. Empty sources are skipped. ``beam=1`` is greedy
    search. ``device``: where the batches go (default: the model's). ``workers`` > 1
    decodes that many batches at once (:func:`seq2seq.inference.workers.in_workers`); the results and their order
    are the same.
    """
    check_beam(beam, nbest)
    settings = settings or SearchSettings()
    settings.check()
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)

    def run(idx: np.ndarray) -> tuple[list[int], list[list[Hypothesis]]]:
        src, src_lens = _pad([encoded[i] for i in idx], device)
        return idx.tolist(), search_batch(model, src, src_lens, beam, nbest, settings)

    batches = length_sorted_batches([len(e) for e in encoded], batch_tokens)
    if workers > 1 and len(batches) > 1:
        from seq2seq.inference.workers import in_workers

        yield from in_workers(run, batches, workers, device.type)
    else:
        yield from map(run, batches)


def decode(
    model: nn.Module,
    tokenizers: _Tokenizers,
    sources: Sequence[str],
    beam: int = 5,
    alpha: float = 0.6,
    max_len_ratio: float = 2.0,
    max_len_extra: int = 10,
    batch_tokens: int = DECODE_BATCH_TOKENS,
    device: str | torch.device = "cpu",
    progress: bool = True,
    workers: int = 1,
) -> Decoded:
    """Translate ``sources`` with ``model``; results come back in the order of ``sources``.

    ``beam=1`` is greedy search; otherwise batched beam search with GNMT length penalty
    ``alpha``. An output holds at most ``int(max_len_ratio * src_tokens) + max_len_extra``
    tokens. ``batch_tokens`` bounds the padded source tokens per batch (before beam
    expansion). A sentence's output does not depend on its batch (search guarantees it).
    ``progress`` shows a bar on stderr when stderr is a terminal (never in a log file).
    ``workers``: batches decoded at once (:func:`search_batches`).
    """
    start = time.perf_counter()
    settings = SearchSettings(alpha, max_len_ratio, max_len_extra)
    encoded = [tokenizers.src.encode(s) for s in sources]
    hyps = [""] * len(sources)
    ents = [math.nan] * len(sources)
    lens = [0] * len(sources)
    batches = search_batches(model, encoded, beam, 1, settings, batch_tokens, device, workers)
    total = sum(1 for e in encoded if e)
    with tqdm(total=total, unit="sent", desc=f"decode beam={beam}",
              disable=None if progress else True, leave=False) as bar:  # None: terminals only
        for idx, out in batches:
            for i, [hyp] in zip(idx, out, strict=True):
                hyps[i] = tokenizers.tgt.decode(hyp.tokens)
                ents[i] = attention_entropy(hyp.attention)
                lens[i] = len(hyp.tokens)
            bar.update(len(idx))
    return Decoded(hyps, ents, lens, time.perf_counter() - start)
