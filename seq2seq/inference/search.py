"""Greedy and batched beam search over ``encode`` / ``init_state`` / ``step`` only.

Search never looks inside the model: the encoder memory and the decoder state expand
to beam rows (``repeat_rows``) and reorder (``index_select``) themselves, whatever the
RNN type or attention.

Scores are length-normalised log-probabilities with the GNMT length penalty
(Wu et al. 2016): score = log P(y) / ((5 + |y|) / 6)^alpha, where |y| counts the
generated tokens including EOS. A hypothesis holds at most
``int(max_len_ratio * source length) + max_len_extra`` tokens (EOS included); one
that reaches the cap ends there without EOS.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seq2seq.constants import BOS_ID, EOS_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.settings import SearchSettings
from seq2seq.inference.vocab import best_tokens

__all__ = ["Hypothesis", "SearchSettings", "beam_search", "greedy", "length_penalty",
           "search_batch"]


@dataclass
class Hypothesis:
    """One output: tokens without BOS/EOS, normalised score, attention (len(tokens), src_len)."""

    tokens: list[int]
    score: float
    attention: Tensor


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def no_grad_mode(device_type: str) -> AbstractContextManager:
    """The grad-free mode decoding runs in: ``inference_mode``, except under autocast.

    Autocast keeps one low-precision copy of each weight for as long as its context
    is open, but not for casts made in inference mode: there every decoder step
    would cast every weight again. ``no_grad`` keeps the cache working.
    """
    if torch.is_autocast_enabled(device_type):
        return torch.no_grad()
    return torch.inference_mode()


@contextmanager
def _eval_mode(model: nn.Module, device_type: str) -> Iterator[None]:
    """Decode without dropout (on a ``device_type`` device), then give the model back in
    the mode it came in."""
    was_training = model.training
    model.eval()
    try:
        with no_grad_mode(device_type):
            yield
    finally:
        model.train(was_training)


def _max_lengths(src_lens: Tensor, ratio: float, extra: int) -> list[int]:
    return [max(1, int(ratio * n) + extra) for n in src_lens.tolist()]


def greedy(model: nn.Module, src: Tensor, src_lens: Tensor, max_len_ratio: float = 2.0,
           max_len_extra: int = 10, alpha: float = 0.6) -> list[Hypothesis]:
    """Greedy decoding of a batch: src (B, S) padded, src_lens (B,) -> B hypotheses.

    ``alpha`` only normalises the score (the same way as beam_search), so beam
    search with beam 1 returns the same tokens and scores.
    """
    with _eval_mode(model, src.device.type):
        memory = model.encode(src, src_lens)
        state = model.init_state(memory)
        max_len = _max_lengths(src_lens, max_len_ratio, max_len_extra)
        limit = torch.tensor(max_len, device=src.device)
        y = torch.full((src.size(0),), BOS_ID, dtype=torch.long, device=src.device)
        total = torch.zeros(src.size(0), device=src.device)
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        tokens, totals, weights = [], [], []
        for t in range(max(max_len)):
            logits, state, w = model.step(y, state, memory)
            best, y = (x.squeeze(1) for x in best_tokens(logits, 1))
            total = total + best  # the running sum, added in the same order as beam search
            tokens.append(y)
            totals.append(total)
            weights.append(w)
            done = done | (y == EOS_ID) | (limit <= t + 1)
            if bool(done.all()):
                break
        toks = torch.stack(tokens, dim=1).tolist()
        sums = torch.stack(totals, dim=1).cpu()
        attn = torch.stack(weights, dim=1).float().cpu()  # (B, T, S)
    hyps = []
    for b, n_src in enumerate(src_lens.tolist()):
        seq = toks[b][: max_len[b]]
        length = seq.index(EOS_ID) + 1 if EOS_ID in seq else len(seq)
        n_out = length - 1 if seq[length - 1] == EOS_ID else length
        score = float(sums[b, length - 1]) / length_penalty(length, alpha)
        hyps.append(Hypothesis(seq[:n_out], score, attn[b, :n_out, :n_src].clone()))
    return hyps


def beam_search(model: nn.Module, src: Tensor, src_lens: Tensor, beam: int = 5,
                alpha: float = 0.6, max_len_ratio: float = 2.0, max_len_extra: int = 10,
                nbest: int = 1) -> list[list[Hypothesis]]:
    """Batched beam search: src (B, S) padded, src_lens (B,) -> per sentence ``nbest``
    hypotheses, best first.

    Each step expands every live beam, keeps the ``beam`` best continuations per
    sentence, and sets aside those among the ``beam`` best that end in EOS. A sentence
    is finished when it has ``nbest`` ended hypotheses and its best live one, scored
    at its current length, is worse than the ``nbest``-th of them (the usual
    heuristic; with beam 1 it stops exactly where greedy does), or at its length cap.
    Finished sentences leave the batch, so a result does not depend on its companions.
    """
    if beam < 1 or not 1 <= nbest <= beam:
        raise ConfigError(f"beam={beam}, nbest={nbest}: need beam >= 1 and 1 <= nbest <= beam")
    with _eval_mode(model, src.device.type):
        search = _BeamSearch(model, src, src_lens, beam, nbest, alpha,
                             _max_lengths(src_lens, max_len_ratio, max_len_extra))
        return search.run()


def search_batch(model: nn.Module, src: Tensor, src_lens: Tensor, beam: int, nbest: int,
                 settings: SearchSettings) -> list[list[Hypothesis]]:
    """One padded batch, src (B, S) and src_lens (B,), through greedy search (``beam`` 1)
    or beam search: per sentence its ``nbest`` hypotheses, best first."""
    s = settings
    if beam == 1:
        return [[h] for h in greedy(model, src, src_lens, s.max_len_ratio, s.max_len_extra,
                                    s.alpha)]
    return beam_search(model, src, src_lens, beam, s.alpha, s.max_len_ratio, s.max_len_extra,
                       nbest=nbest)


@dataclass
class _Ended:
    """A hypothesis set aside: its normalised score and the end of its path (see _Paths)."""

    score: float
    step: int  # its last token's step, -1 for an empty output
    row: int


class _Paths:
    """Every live hypothesis's tokens and attention, as per-step records.

    Copying each live row's history at every step costs O(T^2) per sentence; instead
    step t records its tokens, the row of step t-1 each one extends (``parents``), and
    the attention weights as the model returned them (``weights``, read through
    ``weight_rows``). Only the hypotheses returned are traced back, once.
    """

    def __init__(self) -> None:
        self.tokens: list[list[int]] = []
        self.parents: list[list[int]] = []
        self.weight_rows: list[list[int]] = []
        self.weights: list[Tensor] = []

    def record(self, tokens: Tensor, parents: list[int], weight_rows: list[int],
               weights: Tensor) -> None:
        self.tokens.append(tokens.tolist())
        self.parents.append(parents)
        self.weight_rows.append(weight_rows)
        self.weights.append(weights)

    def trace(self, step: int, row: int, n_src: int) -> tuple[list[int], Tensor]:
        """Tokens (len,) and attention (len, n_src) float32 of the path ending at (step, row)."""
        tokens, weights = [], []
        for s in range(step, -1, -1):
            tokens.append(self.tokens[s][row])
            weights.append(self.weights[s][self.weight_rows[s][row], :n_src])
            row = self.parents[s][row]
        if not weights:
            return [], torch.zeros((0, n_src))
        return tokens[::-1], torch.stack(weights[::-1]).float().cpu()


class _BeamSearch:
    """The state of one batched beam search; rows are (active sentence, beam) pairs."""

    def __init__(self, model: nn.Module, src: Tensor, src_lens: Tensor, beam: int, nbest: int,
                 alpha: float, max_len: list[int]) -> None:
        self.model, self.k, self.nbest, self.alpha = model, beam, nbest, alpha
        self.max_len = max_len
        self.src_lens = src_lens.tolist()
        n, dev = src.size(0), src.device
        self.memory = model.encode(src, src_lens).repeat_rows(beam)
        self.state = model.init_state(self.memory)
        self.active = list(range(n))  # original sentence ids, in row order
        # only beam 0 is live at the start, so the first step does not pick duplicates
        self.scores = torch.full((n, beam), float("-inf"), device=dev)
        self.scores[:, 0] = 0.0
        self.y = torch.full((n * beam,), BOS_ID, dtype=torch.long, device=dev)
        self.paths = _Paths()
        # live row -> its row in the last record; None while they are the same rows
        self.origin: list[int] | None = None
        self.finished: list[list[_Ended]] = [[] for _ in range(n)]

    def run(self) -> list[list[Hypothesis]]:
        for t in range(max(self.max_len)):
            self._advance(t)
            if not self.active:
                break
        out = []
        for sentence, ended in enumerate(self.finished):
            best = sorted(ended, key=lambda e: -e.score)[: self.nbest]  # stable: ties keep order
            hyps = []
            for e in best:
                tokens, attention = self.paths.trace(e.step, e.row, self.src_lens[sentence])
                hyps.append(Hypothesis(tokens, e.score, attention))
            out.append(hyps)
        return out

    def _keep(self, sentence: int, step: int, row: int, score: float, length: int) -> None:
        self.finished[sentence].append(
            _Ended(score / length_penalty(length, self.alpha), step, row))

    def _record_row(self, live_row: int) -> int:
        return live_row if self.origin is None else self.origin[live_row]

    def _advance(self, t: int) -> None:
        k, n = self.k, len(self.active)
        logits, state, w = self.model.step(self.y, self.state, self.memory)
        # a sentence's 2k best continuations are among the 2k best of each of its rows:
        # choosing per row first spares the (n, k*V) matrix of every candidate's score
        width = min(2 * k, logits.size(-1))
        row_s, row_tok = best_tokens(logits, width)  # (n*k, width)
        cand = (self.scores.view(-1, 1) + row_s).view(n, k * width)
        top_s, top_i = cand.topk(2 * k, dim=1)  # (n, 2k): at most k of them end in EOS
        tok = row_tok.view(n, k * width).gather(1, top_i)
        rows = torch.arange(n, device=tok.device).unsqueeze(1) * k + top_i // width
        is_eos = tok == EOS_ID
        # ended hypotheses: EOS among the k best candidates; their path ends at step t-1
        ended = is_eos[:, :k].nonzero().tolist()
        if ended:
            scores, row_of = top_s.tolist(), rows.tolist()
            for i, r in ended:
                if scores[i][r] > float("-inf"):
                    row = row_of[i][r]
                    self._keep(self.active[i], t - 1, self._record_row(row) if t else -1,
                               scores[i][r], t + 1)
        # live hypotheses: the k best candidates that did not end
        self.scores, pick = top_s.masked_fill(is_eos, float("-inf")).topk(k, dim=1)
        keep_rows = rows.gather(1, pick).view(-1)
        self.y = tok.gather(1, pick).view(-1)
        live = keep_rows.tolist()
        self.paths.record(self.y, [self._record_row(r) for r in live] if t else live, live, w)
        self.origin = None
        self.state = state.index_select(keep_rows)
        self._retire(t)

    def _done(self, sentence: int, best_live: float, length: int) -> bool:
        """True when ``nbest`` hypotheses ended and the best live one scores below them."""
        ended = self.finished[sentence]
        if best_live == float("-inf"):
            return True
        if len(ended) < self.nbest:
            return False
        nth = sorted((h.score for h in ended), reverse=True)[self.nbest - 1]
        return best_live / length_penalty(length, self.alpha) < nth

    def _retire(self, t: int) -> None:
        """Drop the sentences that are done or at their length cap."""
        k, still = self.k, []
        scores = self.scores.tolist()  # (n, k), best live hypothesis first
        for i, sentence in enumerate(self.active):
            if t + 1 >= self.max_len[sentence]:
                for j in range(k):  # the cap ends the live hypotheses without EOS
                    if scores[i][j] > float("-inf"):
                        self._keep(sentence, t, i * k + j, scores[i][j], t + 1)
            elif not self._done(sentence, scores[i][0], t + 1):
                still.append(i)
        if len(still) == len(self.active):
            return
        idx = torch.tensor(still, dtype=torch.long, device=self.y.device)
        rows = (idx.unsqueeze(1) * k + torch.arange(k, device=idx.device)).view(-1)
        self.active = [self.active[i] for i in still]
        self.scores = self.scores.index_select(0, idx)
        self.y = self.y[rows]
        self.origin = rows.tolist()
        self.state = self.state.index_select(rows)
        self.memory = self.memory.index_select(rows)
