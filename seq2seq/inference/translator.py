"""Translate sentences with a trained run: the Python API.

    from seq2seq.inference.translator import Translator
    t = Translator.from_run("runs/short_bahdanau")      # a run folder or a .pt in one
    [r] = t.translate(["En el principio creó Dios los cielos y la tierra."], beam=5)
    r.text, r.src_tokens, r.tgt_tokens, r.score, r.attention  # (len(tgt), len(src))

The command line around it is :mod:`seq2seq.inference.command`. Importing this
module does not import torch (the prompt starts while torch loads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.config import check_beam
from seq2seq.constants import DECODE_BATCH_TOKENS
from seq2seq.errors import ConfigError
from seq2seq.inference.settings import SearchSettings

# The RNN has no hard length limit, but a pasted page would make beam search slow and
# memory-hungry for an output nobody trained for: inputs are capped at this many
# subwords per training word (train.max_src_words), unless max_src_tokens= says otherwise.
TOKENS_PER_TRAINING_WORD = 4
# Before tokenization a line is cut at this many UTF-8 bytes (a few pages of text): no
# sentence is that long, and SentencePiece's time grows with the input.
MAX_INPUT_BYTES = 20_000


@dataclass
class Translation:
    """One translated sentence.

    text: the detokenized best hypothesis ("" for an empty source).
    src_tokens / tgt_tokens: the subwords the model read / wrote (no BOS/EOS).
    score: length-normalised log-probability (see seq2seq.inference.search).
    attention: (len(tgt_tokens), len(src_tokens)) float32, row t = the weights over the
        source when writing target subword t (all zero for model.attention.name=none).
    truncated: the source was cut to the model's maximum length before translating.
    alternatives: with nbest > 1, the 2nd..n-th best hypotheses, best first.
    """

    source: str
    text: str
    src_tokens: list[str]
    tgt_tokens: list[str]
    score: float
    attention: np.ndarray
    truncated: bool = False
    alternatives: list[Translation] = field(default_factory=list)


class Translator:
    """A trained model with its tokenizers, ready to translate lists of sentences."""

    def __init__(self, model: Any, tokenizers: Any, max_src_tokens: int,
                 search: SearchSettings | None = None, bf16: bool = False) -> None:
        if max_src_tokens < 1:
            raise ConfigError(f"max_src_tokens={max_src_tokens} must be a positive number of subwords")
        self.model = model
        self.tokenizers = tokenizers
        self.max_src_tokens = max_src_tokens
        self.search = search or SearchSettings()
        # bf16 autocast while searching (seq2seq.precision chooses it); the log-softmax and
        # the beam scores stay fp32
        self.bf16 = bf16
        # batches decoded at once in file translation (seq2seq.inference.workers.in_workers)
        self.workers = 1

    @classmethod
    def from_run(cls, path: str | Path | Sequence[str], device: str = "cpu", max_src_tokens: int = 0,
                 search: SearchSettings | None = None) -> Translator:
        """Load ``best.pt`` (else ``last.pt``) of a run folder, or a checkpoint file; a list
        of them is an ensemble (:func:`seq2seq.inference.ensemble.load_models`).

        ``max_src_tokens=0`` caps inputs at 4 subwords per word of the run's
        ``train.max_src_words``. CheckpointError if the run is missing or corrupt.
        Decoding a few sentences at a time is fastest with ``torch.set_num_threads(1)``
        (the command line does that by default; this API leaves torch's setting alone).
        """
        from seq2seq.inference.ensemble import load_models
        from seq2seq.runtime import resolve_device

        model, tokenizers, cfg = load_models(path, device=resolve_device(device))
        if max_src_tokens <= 0:
            max_src_tokens = TOKENS_PER_TRAINING_WORD * int(cfg.train.max_src_words)
        return cls(model, tokenizers, max_src_tokens, search)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def encode(self, sentence: str) -> tuple[list[int], list[str], bool]:
        """Source ids and subwords as training saw them (no BOS/EOS, as
        seq2seq.corpus.batching.encode_pairs), cut to ``max_src_tokens``; and whether cut."""
        sentence, _ = repair_text(sentence)
        raw = sentence.encode("utf-8")
        too_long = len(raw) > MAX_INPUT_BYTES
        if too_long:  # cut at a character boundary
            sentence = raw[:MAX_INPUT_BYTES].decode("utf-8", errors="ignore")
        ids = self.tokenizers.src.encode(sentence)
        pieces = self.tokenizers.src.pieces(sentence)
        if len(pieces) != len(ids):  # not one piece per id: name the ids instead
            pieces = [self.tokenizers.src.id_to_piece(i) for i in ids]
        cut = too_long or len(ids) > self.max_src_tokens
        return ids[: self.max_src_tokens], pieces[: self.max_src_tokens], cut

    def translate(self, sentences: Sequence[str], beam: int = 5, nbest: int = 1,
                  batch_tokens: int = DECODE_BATCH_TOKENS,
                  on_batch: Callable[[int], None] | None = None
                  ) -> list[Translation]:
        """Translate ``sentences``; one Translation per sentence, in their order.

        ``beam=1`` is greedy search. Sentences are decoded in length-sorted batches of
        at most ``batch_tokens`` padded source subwords; a sentence's result does not
        depend on its companions. An empty (or all-space) sentence gives ``text=""``.
        ``on_batch(n)`` is called after each batch of ``n`` sentences (a progress bar).
        """
        from seq2seq.inference.decode import search_batches

        check_beam(beam, nbest)
        if isinstance(sentences, str):
            raise TypeError("translate() takes a list of sentences, not one string")
        encoded = [self.encode(s.strip()) for s in sentences]
        results = [Translation(s, "", pieces, [], 0.0, np.zeros((0, len(pieces)), np.float32), cut)
                   for s, (_, pieces, cut) in zip(sentences, encoded, strict=True)]
        from seq2seq.runtime import autocast

        batches = search_batches(self.model, [ids for ids, _, _ in encoded], beam, nbest,
                                 self.search, batch_tokens, workers=self.workers)
        with autocast(self.device, self.bf16):  # the generator decodes inside this block
            for idx, hyps_per_sentence in batches:
                for i, hyps in zip(idx, hyps_per_sentence, strict=True):
                    best, *rest = [self._translation(results[i], h) for h in hyps]
                    best.alternatives = rest
                    results[i] = best
                if on_batch is not None:
                    on_batch(len(idx))
        return results

    def _translation(self, empty: Translation, hyp: Any) -> Translation:
        tgt = self.tokenizers.tgt
        return Translation(
            source=empty.source, text=tgt.decode(hyp.tokens), src_tokens=empty.src_tokens,
            tgt_tokens=[tgt.id_to_piece(i) for i in hyp.tokens], score=float(hyp.score),
            attention=hyp.attention.float().cpu().numpy(), truncated=empty.truncated)


def truncation_warning(where: str, limit: int) -> str:
    return (f"warning: {where}: input cut to the model's maximum of {limit} subwords; "
            "split long text into sentences (or raise max_src_tokens=)")


def decode_line(raw: bytes) -> tuple[str, bool]:
    """A line of bytes as text without its line ending; True if it held invalid UTF-8
    (each bad byte sequence becomes U+FFFD)."""
    raw = raw.rstrip(b"\r\n")
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def repair_text(text: str) -> tuple[str, bool]:
    """Text with lone surrogates (undecodable terminal bytes, as prompt_toolkit passes
    them on) replaced by U+FFFD; True if any were. SentencePiece cannot encode them."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        pass
    try:  # surrogate-escaped bytes: decode the original bytes properly
        raw = text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", errors="surrogatepass")
    return raw.decode("utf-8", errors="replace"), True
