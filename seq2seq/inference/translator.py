"""Translate sentences with a trained run: the Python API and the `seq2seq-translate` app.

    from seq2seq.inference.translator import Translator
    t = Translator.from_run("runs/short_bahdanau")      # a run folder or a .pt in one
    [r] = t.translate(["En el principio creó Dios los cielos y la tierra."], beam=5)
    r.text, r.src_tokens, r.tgt_tokens, r.score, r.attention  # (len(tgt), len(src))

`seq2seq-translate run=<run folder or checkpoint> [beam=5]` opens the interactive prompt
(:mod:`seq2seq.inference.prompt`) when standard input is a terminal. With ``input=FILE``, or when
standard input is a file, it translates in batches (:mod:`seq2seq.inference.translate_file`, also
n-best lists and alignments); from a pipe it is a filter: one output line per input
line, in order, flushed per line, warnings on stderr only. ``run=[a,b,c]`` decodes
with an ensemble of the runs (:mod:`seq2seq.inference.ensemble`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from seq2seq.constants import MAX_BEAM
from seq2seq.errors import CheckpointError, ConfigError

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


@dataclass
class SearchSettings:
    """How an output is searched; see seq2seq.inference.search for the meaning of each."""

    alpha: float = 0.6
    max_len_ratio: float = 2.0
    max_len_extra: int = 10


def check_request(beam: int, nbest: int) -> None:
    """ConfigError unless 1 <= nbest <= beam <= MAX_BEAM."""
    if not 1 <= beam <= MAX_BEAM:
        raise ConfigError(f"beam={beam}: the beam size must be between 1 (greedy) and {MAX_BEAM}")
    if not 1 <= nbest <= beam:
        raise ConfigError(f"nbest={nbest} with beam={beam}: nbest must be between 1 and the "
                          "beam size; raise the beam or lower nbest")


class Translator:
    """A trained model with its tokenizers, ready to translate lists of sentences."""

    def __init__(self, model: Any, tokenizers: Any, max_src_tokens: int,
                 search: SearchSettings | None = None) -> None:
        if max_src_tokens < 1:
            raise ConfigError(f"max_src_tokens={max_src_tokens} must be a positive number of subwords")
        self.model = model
        self.tokenizers = tokenizers
        self.max_src_tokens = max_src_tokens
        self.search = search or SearchSettings()

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
        import torch

        from seq2seq.inference.ensemble import load_models

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={device} but no CUDA device is visible: use device=cpu or auto")
        model, tokenizers, cfg = load_models(path, device=device)
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
                  batch_tokens: int = 2000, on_batch: Callable[[int], None] | None = None
                  ) -> list[Translation]:
        """Translate ``sentences``; one Translation per sentence, in their order.

        ``beam=1`` is greedy search. Sentences are decoded in length-sorted batches of
        at most ``batch_tokens`` padded source subwords; a sentence's result does not
        depend on its companions. An empty (or all-space) sentence gives ``text=""``.
        ``on_batch(n)`` is called after each batch of ``n`` sentences (a progress bar).
        """
        from seq2seq.inference.decode import length_sorted_batches

        check_request(beam, nbest)
        if isinstance(sentences, str):
            raise TypeError("translate() takes a list of sentences, not one string")
        encoded = [self.encode(s.strip()) for s in sentences]
        results = [Translation(s, "", pieces, [], 0.0, np.zeros((0, len(pieces)), np.float32), cut)
                   for s, (_, pieces, cut) in zip(sentences, encoded, strict=True)]
        for idx in length_sorted_batches([len(ids) for ids, _, _ in encoded], batch_tokens):
            batch = [encoded[i][0] for i in idx]
            for i, hyps in zip(idx.tolist(), self._search(batch, beam, nbest), strict=True):
                best, *rest = [self._translation(results[i], h) for h in hyps]
                best.alternatives = rest
                results[i] = best
            if on_batch is not None:
                on_batch(len(idx))
        return results

    def _search(self, batch: list[list[int]], beam: int, nbest: int) -> list[list[Any]]:
        """Padded search over one batch -> per sentence its ``nbest`` Hypothesis, best first."""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        from seq2seq.constants import PAD_ID
        from seq2seq.inference.search import beam_search

        src = pad_sequence([torch.tensor(ids, dtype=torch.long) for ids in batch],
                           batch_first=True, padding_value=PAD_ID)  # (B, S)
        src_lens = torch.tensor([len(ids) for ids in batch], dtype=torch.long)  # (B,)
        s = self.search
        return beam_search(self.model, src.to(self.device), src_lens.to(self.device), beam=beam,
                           alpha=s.alpha, max_len_ratio=s.max_len_ratio,
                           max_len_extra=s.max_len_extra, nbest=nbest)

    def _translation(self, empty: Translation, hyp: Any) -> Translation:
        tgt = self.tokenizers.tgt
        return Translation(
            source=empty.source, text=tgt.decode(hyp.tokens), src_tokens=empty.src_tokens,
            tgt_tokens=[tgt.id_to_piece(i) for i in hyp.tokens], score=float(hyp.score),
            attention=hyp.attention.float().cpu().numpy(), truncated=empty.truncated)


# ---------------------------------------------------------------- the command line


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


def run_filter(translator: Translator, lines: IO[bytes], out: IO[str], err: IO[str],
               beam: int = 5, nbest: int = 1, align: IO[str] | None = None,
               hard: bool = False) -> int:
    """Translate ``lines`` one by one: one line on ``out`` per input line (or its n-best
    rows, :mod:`seq2seq.inference.translate_file`), flushed at once so a pipe partner sees it;
    warnings on ``err``. Returns the number of lines."""
    from seq2seq.inference.translate_file import Writers, translate_lines

    writers = Writers(out, nbest, align, hard, flush=True)
    return translate_lines(translator, lines, writers, err, beam, nbest, block_lines=1)


def check_run_exists(run: Any) -> None:
    """Fail on a mistyped run path (or any member's, for an ensemble) at once, before the
    slow torch import."""
    from seq2seq.inference.ensemble import run_list

    for member in run_list(run):
        path = Path(member).expanduser()
        if not path.exists():
            raise CheckpointError(f"{path} does not exist: pass a run folder written by "
                                  "seq2seq-train or a .pt file in it")


def translator_from_config(cfg: Any, batched: bool = False) -> Translator:
    """The Translator a checked TranslateConfig (seq2seq.config.validate_translate) describes;
    ``batched``: for file mode, where ``threads=-1`` (auto) means all cores, not one."""
    check_run_exists(cfg.run)
    threads = cfg.threads if cfg.threads >= 0 else (0 if batched else 1)
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    search = SearchSettings(cfg.alpha, cfg.max_len_ratio, cfg.max_len_extra)
    return Translator.from_run(cfg.run, cfg.device, cfg.max_src_tokens, search)


def run_interactive(cfg: Any) -> None:
    """The prompt, shown at once while torch and the model load in a background thread
    (importing torch alone takes 1.5-3 s on a CPU machine); the first translation waits
    for the load, and a failed load ends the session with its one-line error."""
    from concurrent.futures import ThreadPoolExecutor

    from seq2seq.inference.prompt import Repl

    check_run_exists(cfg.run)  # the common typo fails before the prompt, not after it
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="load-model") as pool:
        Repl(pool.submit(translator_from_config, cfg), cfg).run()


def _utf8(stream: Any) -> None:
    """Write UTF-8 whatever the locale (a C locale would fail on the first accent)."""
    if hasattr(stream, "reconfigure"):
        stream.reconfigure(encoding="utf-8", errors="replace")


def translate_main(cfg: Any) -> None:
    """`seq2seq-translate`: the prompt on a terminal, batched file translation for
    ``input=``/``output=``/``alignments=`` or a file on stdin, else a line filter."""
    from seq2seq.inference.translate_file import stdin_is_file, translate_file_main

    file_mode = bool(cfg.input or cfg.output or cfg.alignments) or stdin_is_file()
    if sys.stdin.isatty() and not file_mode:
        run_interactive(cfg)
        return
    _utf8(sys.stdout)
    _utf8(sys.stderr)
    translator = translator_from_config(cfg, batched=file_mode)
    try:
        if file_mode:
            translate_file_main(cfg, translator)
        else:
            run_filter(translator, sys.stdin.buffer, sys.stdout, sys.stderr, cfg.beam, cfg.nbest)
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): stop quietly, and keep Python from
        # complaining when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
