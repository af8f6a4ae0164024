"""`seq2seq-translate`: the prompt on a terminal, file translation, or a line filter.

``seq2seq-translate run=<run folder or checkpoint> [beam=5]`` opens the interactive prompt
(:mod:`seq2seq.inference.prompt`) when standard input is a terminal. With ``input=FILE``,
or when standard input is a file, it translates in batches
(:mod:`seq2seq.inference.translate_file`, also n-best lists and alignments); from a pipe
it is a filter: one output line per input line, in order, flushed per line, warnings on
stderr only. ``run=[a,b,c]`` decodes with an ensemble of the runs
(:mod:`seq2seq.inference.ensemble`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from seq2seq.errors import CheckpointError
from seq2seq.inference.settings import SearchSettings
from seq2seq.inference.translator import Translator


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
    translator = Translator.from_run(cfg.run, cfg.device, cfg.max_src_tokens, search)
    choose_speed(cfg, translator, batched)
    return translator


def choose_speed(cfg: Any, translator: Translator, batched: bool) -> Any:
    """Set ``translator.workers`` and ``translator.bf16`` for this mode (``workers=`` first,
    since each worker decodes on one thread and the precision is timed there); returns
    the precision choice (seq2seq.precision.Choice).

    When bf16 is chosen, auto workers are timed again under bf16: the first timing ran in
    fp32, and which layout wins depends on the precision (docs/performance.md#decoding)."""
    translator.workers = choose_workers(cfg, translator, batched)
    with _threads(1 if translator.workers > 1 else 0):
        choice = choose_precision(cfg, translator, batched)
    translator.bf16 = choice.bf16
    if choice.bf16 and batched and cfg.workers <= 0:  # workers=N is taken as given
        from seq2seq.runtime import autocast

        with autocast(translator.device, True):
            translator.workers = choose_workers(cfg, translator, batched, "in bf16")
    return choice


def choose_workers(cfg: Any, translator: Translator, batched: bool, how: str = "") -> int:
    """``workers=`` resolved for this mode (seq2seq.inference.workers.choose_workers): file
    mode's batches may decode side by side; the filter and the prompt decode one sentence
    at a time, so 1. In file mode on a terminal the choice goes to stderr (``how``: the
    precision it was timed in, when not fp32)."""
    if not batched:
        return 1
    from seq2seq.inference import workers

    n, why = workers.choose_workers(cfg.workers, translator.model, cfg.batch_tokens, cfg.beam)
    if sys.stderr.isatty():
        print(f"workers{' ' + how if how else ''}: {why}", file=sys.stderr, flush=True)
    return n


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch on ``n`` threads inside the block (0: as it is)."""
    import torch

    if not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def choose_precision(cfg: Any, translator: Translator, batched: bool) -> Any:
    """``precision=`` resolved for this mode's batch size: file mode decodes about
    batch_tokens / 30 sentences per batch, the filter and the prompt one. In file mode
    on a terminal the choice and its timings go to stderr, beside the progress bar (logs
    and the filter's stderr are for warnings only)."""
    from seq2seq import precision
    from seq2seq.inference.probe import PROBE_SRC_LEN, step_probe

    sentences = max(1, cfg.batch_tokens // PROBE_SRC_LEN) if batched else 1
    probe = step_probe(translator.model, sentences, cfg.beam, PROBE_SRC_LEN)
    choice = precision.choose(str(cfg.precision), translator.device, probe, key="precision",
                              what=f"a decoding batch of {sentences} x beam {cfg.beam}")
    if batched and sys.stderr.isatty():
        print(f"precision: {choice.reason}", file=sys.stderr, flush=True)
    return choice


def run_interactive(cfg: Any) -> None:
    """The prompt, shown at once while torch and the model load in a background thread
    (importing torch alone takes seconds on a CPU machine; docs/performance.md#decoding);
    the first translation waits for the load, and a failed load ends the session with its
    one-line error."""
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
