"""Translate a file (or a stream) of sentences: batched, with n-best lists and alignments.

``seq2seq-translate run=R input=in.es output=out.en`` (or ``< in.es`` when standard input
is a file, not a pipe) reads the input in blocks of :data:`BLOCK_LINES` lines, decodes
each block in length-sorted token batches (:meth:`seq2seq.inference.translator.Translator.translate`)
and writes the results back in input order. A pipe that a person may be typing into is
translated line by line instead, each line flushed at once: the same writers with
blocks of one line.

What is written, per input line (line numbers count from 1):

- ``output`` (stdout when empty), ``nbest=1``: the best translation, one line.
- ``output`` with ``nbest=N > 1``: N tab-separated rows ``line, rank, score,
  translation`` (rank 1 = best; score = the length-normalised log-probability of
  :mod:`seq2seq.inference.search`). An empty input line gets one row with an empty translation.
- ``alignments=FILE``: one JSON object per line:
  ``{"line", "source", "translation", "src_tokens", "tgt_tokens", ...}`` plus, with
  ``alignment=soft``, ``"attention"``: rows = target subwords, columns = source subwords;
  with ``alignment=hard``, ``"alignment"``: Pharaoh ``"j-i"`` pairs (source subword j is
  the most attended one when writing target subword i). Both are ``null`` for a model
  without attention (``none``).

A line whose decoding fails unexpectedly comes back empty, with a message on stderr;
the other lines of its block are translated again one by one, so the output still has
exactly one entry per input line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import numpy as np

from seq2seq.atomic import atomic_open
from seq2seq.constants import DECODE_BATCH_TOKENS
from seq2seq.errors import Seq2SeqError

BLOCK_LINES = 5000  # lines sorted and decoded together; bounds the memory of a huge file


def _blocks(lines: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    block: list[bytes] = []
    for raw in lines:
        block.append(raw)
        if len(block) >= size:
            yield block
            block = []
    if block:
        yield block


def hard_alignment(attention: np.ndarray) -> str:
    """Pharaoh pairs ``"j-i"``: for each target subword i, its most attended source subword j."""
    return " ".join(f"{int(row.argmax())}-{i}" for i, row in enumerate(attention))


def alignment_record(line: int, result: Any, hard: bool) -> dict[str, Any]:
    """The JSON object of one translated line (see the module docstring)."""
    weights = np.asarray(result.attention, dtype=np.float32)
    has = weights.size > 0 and bool(weights.any())
    record: dict[str, Any] = {"line": line, "source": result.source, "translation": result.text,
                              "src_tokens": result.src_tokens, "tgt_tokens": result.tgt_tokens}
    if hard:
        record["alignment"] = hard_alignment(weights) if has else None
    else:
        record["attention"] = np.round(weights, 4).tolist() if has else None
    return record


class Writers:
    """Where results go: the translation (or n-best TSV) stream and the alignments file."""

    def __init__(self, out: IO[str], nbest: int, align: IO[str] | None, hard: bool,
                 flush: bool) -> None:
        self.out, self.nbest, self.align, self.hard, self.flush = out, nbest, align, hard, flush

    def write(self, line: int, result: Any) -> None:
        if self.nbest > 1:
            for rank, hyp in enumerate([result, *result.alternatives], start=1):
                text = hyp.text.replace("\n", " ").replace("\t", " ")
                self.out.write(f"{line}\t{rank}\t{hyp.score:.4f}\t{text}\n")
        else:
            self.out.write(result.text.replace("\n", " ") + "\n")
        if self.align is not None:
            record = alignment_record(line, result, self.hard)
            self.align.write(json.dumps(record, ensure_ascii=False) + "\n")
        if self.flush:
            self.out.flush()
            if self.align is not None:
                self.align.flush()


def _translate_block(translator: Any, texts: list[str], beam: int, nbest: int,
                     batch_tokens: int, first: int, err: IO[str],
                     on_batch: Callable[[int], None] | None) -> list[Any]:
    """Translations of ``texts``; a failure sends the block through one line at a time,
    where a line that still fails gets an empty result and a message on ``err``."""
    try:
        return translator.translate(texts, beam=beam, nbest=nbest, batch_tokens=batch_tokens,
                                    on_batch=on_batch)
    except Seq2SeqError:
        raise
    except Exception:  # one bad line must not end a long job
        if len(texts) > 1:
            return [_translate_block(translator, [t], beam, nbest, batch_tokens, first + k, err,
                                     None)[0] for k, t in enumerate(texts)]
    [empty] = translator.translate([""], beam=beam, nbest=1)
    empty.source = texts[0]
    print(f"warning: line {first}: translation failed unexpectedly; writing an empty line",
          file=err, flush=True)
    return [empty]


def translate_lines(translator: Any, lines: Iterable[bytes], writers: Writers, err: IO[str],
                    beam: int = 5, nbest: int = 1, batch_tokens: int = DECODE_BATCH_TOKENS,
                    block_lines: int = BLOCK_LINES, progress: Any = None) -> int:
    """Translate ``lines`` (bytes, one sentence each) block by block into ``writers``, in
    input order; warnings (invalid UTF-8, cut inputs, failures) on ``err``. Returns the
    number of lines. ``progress``: a tqdm bar updated per decoded batch, or None."""
    from seq2seq.inference.translator import decode_line, truncation_warning

    n = 0
    on_batch = progress.update if progress is not None else None
    for block in _blocks(lines, block_lines):
        texts = []
        for k, raw in enumerate(block, start=n + 1):
            text, bad = decode_line(raw)
            if bad:
                print(f"warning: line {k}: invalid UTF-8 replaced by U+FFFD", file=err, flush=True)
            texts.append(text)
        results = _translate_block(translator, texts, beam, nbest, batch_tokens, n + 1, err,
                                   on_batch)
        for k, result in enumerate(results, start=n + 1):
            if result.truncated:
                print(truncation_warning(f"line {k}", translator.max_src_tokens), file=err,
                      flush=True)
            writers.write(k, result)
        if progress is not None:  # empty lines are not decoded, so no batch counted them
            progress.update(len(block) - sum(1 for t in texts if t.strip()))
        n += len(block)
    return n


def _open_input(cfg: Any, stack: ExitStack) -> tuple[IO[bytes], int | None]:
    """The input's byte lines and their count when known (for the progress bar)."""
    if not cfg.input:
        return sys.stdin.buffer, None
    path = Path(cfg.input).expanduser()
    try:
        with path.open("rb") as fh:
            total = sum(1 for _ in fh)
        return stack.enter_context(path.open("rb")), total
    except OSError as err:
        raise Seq2SeqError(f"cannot read input={path} ({err.strerror}): pass an existing "
                           "text file, one sentence per line") from None


def translate_file_main(cfg: Any, translator: Any) -> int:
    """File mode of `seq2seq-translate` (see the module docstring); returns the line count."""
    from tqdm import tqdm

    with ExitStack() as stack:
        lines, total = _open_input(cfg, stack)
        out = stack.enter_context(atomic_open(Path(cfg.output).expanduser())) if cfg.output \
            else sys.stdout
        align = (stack.enter_context(atomic_open(Path(cfg.alignments).expanduser()))
                 if cfg.alignments else None)
        writers = Writers(out, cfg.nbest, align, cfg.alignment == "hard", flush=False)
        bar = stack.enter_context(tqdm(total=total, unit="sent", desc="translate",
                                       file=sys.stderr, disable=not sys.stderr.isatty()))
        n = translate_lines(translator, lines, writers, sys.stderr, cfg.beam, cfg.nbest,
                            cfg.batch_tokens, BLOCK_LINES, bar)
    return n


def stdin_is_file() -> bool:
    """Standard input is a regular file (``< file``), not a pipe or a terminal."""
    import stat

    try:
        return stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError):
        return False
