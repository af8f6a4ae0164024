"""The beam search as first written, kept as the plain reference of the fast one.

Each step copies every live row's token history and attention history
(``torch.cat``): simple to read and obviously right, but O(T^2) per sentence.
``seq2seq.inference.search`` keeps per-step records and traces back only the
hypotheses it returns; tests/test_search.py checks both give the same output.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.constants import BOS_ID, EOS_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.search import (
    Hypothesis,
    _eval_mode,
    _max_lengths,
    length_penalty,
)
from seq2seq.inference.vocab import _log_probs


def reference_beam_search(model: nn.Module, src: Tensor, src_lens: Tensor, beam: int = 5,
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
        finished = search.run()
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


class _BeamSearch:
    """The state of one batched beam search; rows are (active sentence, beam) pairs."""

    def __init__(self, model: nn.Module, src: Tensor, src_lens: Tensor, beam: int, nbest: int,
                 alpha: float, max_len: list[int]) -> None:
        self.model, self.k, self.nbest, self.alpha = model, beam, nbest, alpha
        self.max_len = max_len
        self.src_lens = src_lens.tolist()
        n, dev = src.size(0), src.device
        # the model's own beam expansion, as the fast search uses: both then run the same
        # model computations, so their outputs can be compared exactly
        self.memory = model.encode(src, src_lens).repeat_rows(beam)
        self.state = model.init_state(self.memory)
        self.active = list(range(n))  # original sentence ids, in row order
        # only beam 0 is live at the start, so the first step does not pick duplicates
        self.scores = torch.full((n, beam), float("-inf"), device=dev)
        self.scores[:, 0] = 0.0
        self.y = torch.full((n * beam,), BOS_ID, dtype=torch.long, device=dev)
        self.history = torch.zeros((n * beam, 0), dtype=torch.long, device=dev)
        self.attn = torch.zeros((n * beam, 0, src.size(1)), device=dev)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(n)]

    def run(self) -> list[list[Hypothesis]]:
        for t in range(max(self.max_len)):
            self._advance(t)
            if not self.active:
                break
        return self.finished

    def _keep(self, sentence: int, row: int, score: float, length: int) -> None:
        n_src = self.src_lens[sentence]
        self.finished[sentence].append(Hypothesis(
            tokens=self.history[row].tolist(),
            score=score / length_penalty(length, self.alpha),
            attention=self.attn[row, :, :n_src].float().cpu().clone()))

    def _advance(self, t: int) -> None:
        k, n = self.k, len(self.active)
        logits, state, w = self.model.step(self.y, self.state, self.memory)
        logp = _log_probs(logits)
        vocab = logp.size(-1)
        cand = (self.scores.view(-1, 1) + logp).view(n, k * vocab)
        top_s, top_i = cand.topk(2 * k, dim=1)  # (n, 2k): at most k of them end in EOS
        tok = top_i % vocab
        rows = torch.arange(n, device=tok.device).unsqueeze(1) * k + top_i // vocab
        is_eos = tok == EOS_ID
        # ended hypotheses: EOS among the k best candidates (excluding EOS from attention)
        for i, r in is_eos[:, :k].nonzero().tolist():
            if top_s[i, r] > float("-inf"):
                self._keep(self.active[i], int(rows[i, r]), float(top_s[i, r]), t + 1)
        # live hypotheses: the k best candidates that did not end
        self.scores, pick = top_s.masked_fill(is_eos, float("-inf")).topk(k, dim=1)
        keep_rows = rows.gather(1, pick).view(-1)
        self.y = tok.gather(1, pick).view(-1)
        self.history = torch.cat([self.history[keep_rows], self.y.unsqueeze(1)], dim=1)
        self.attn = torch.cat([self.attn[keep_rows], w[keep_rows].float().unsqueeze(1)], dim=1)
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
                        self._keep(sentence, i * k + j, scores[i][j], t + 1)
            elif not self._done(sentence, scores[i][0], t + 1):
                still.append(i)
        if len(still) == len(self.active):
            return
        idx = torch.tensor(still, dtype=torch.long, device=self.y.device)
        rows = (idx.unsqueeze(1) * k + torch.arange(k, device=idx.device)).view(-1)
        self.active = [self.active[i] for i in still]
        self.scores = self.scores.index_select(0, idx)
        self.y, self.history = self.y[rows], self.history[rows]
        self.attn = self.attn[rows]
        self.state = self.state.index_select(rows)
        self.memory = self.memory.index_select(rows)
