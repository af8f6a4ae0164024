"""File translation throughput: the batched file mode against the line-by-line filter.

    .venv/bin/python scripts/bench_translate.py --run runs/reproduce_quick/arms/bahdanau \
        --split test --beam 5 --out bench_translate.json

Both modes translate the same lines of one split with the same loaded model, in the
same process, one after the other (filter first), each with the thread count that
`seq2seq-translate`'s default (``threads=-1``, auto) gives it and the precision its
``precision=auto`` picks for that mode (``--precision`` overrides): the filter decodes each
line alone on 1 thread (:func:`seq2seq.inference.command.run_filter`, what a pipe gets), file
mode decodes blocks in length-sorted token batches on all cores
(:func:`seq2seq.inference.translate_file.translate_lines`, what ``input=``/``< file`` gets),
with the ``workers`` its ``workers=-1`` (auto) picks (``--workers`` overrides). Like
``seq2seq-translate``, it has glibc keep freed memory (``runtime.keep_freed_memory``;
``--no-keep-freed-memory`` measures glibc's default instead). It checks that both
wrote the same translations, and records lines/s, the ratio, the
threads and the CPU (model and flags).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from seq2seq import native
from seq2seq.constants import DECODE_BATCH_TOKENS
from seq2seq.evaluation.command import run_split
from seq2seq.inference.command import choose_speed, run_filter
from seq2seq.inference.translate_file import Writers, translate_lines
from seq2seq.inference.translator import Translator
from seq2seq.runtime import cpu_description, keep_freed_memory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a run folder (or a list joined by commas)")
    p.add_argument("--split", default="test")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lines", type=int, default=0, help="only the first N lines (0 = all)")
    p.add_argument("--batch-tokens", type=int, default=DECODE_BATCH_TOKENS)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the filter (1: the CLI's auto setting for a pipe)")
    p.add_argument("--file-threads", type=int, default=0,
                   help="torch threads of file mode (0 = all cores: the CLI's auto for a file)")
    p.add_argument("--modes", default="filter,file", help="which modes to time, in order")
    p.add_argument("--workers", type=int, default=-1,
                   help="as seq2seq-translate's workers= (file mode): -1 = auto, timed at start")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="as seq2seq-translate's precision=: auto times the decoder per mode")
    p.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="glibc keeps freed memory, as seq2seq-translate has it (default: on)")
    p.add_argument("--out", default="", help="also write the record as JSON here")
    args = p.parse_args()
    kept = args.keep_freed_memory and keep_freed_memory()
    cores = torch.get_num_threads()
    runs = args.run.split(",")
    _, _, split = run_split(runs[0], args.split)
    sources = split.sources[: args.lines or None]
    raw = "".join(s.replace("\n", " ") + "\n" for s in sources).encode()
    translator = Translator.from_run(runs if len(runs) > 1 else runs[0])
    threads = {"filter": args.threads or cores, "file": args.file_threads or cores}
    record = {"run": runs, "split": args.split, "lines": len(sources), "beam": args.beam,
              "threads": threads, "keep_freed_memory": kept, "cpu": cpu_description()}
    outputs = {}
    modes = args.modes.split(",")
    settings = SimpleNamespace(precision=args.precision, beam=args.beam,
                               batch_tokens=args.batch_tokens, workers=args.workers)
    for mode in modes:
        torch.set_num_threads(threads[mode])
        choice = choose_speed(settings, translator, batched=mode == "file")
        record[f"{mode}_precision"] = choice.reason
        record[f"{mode}_workers"] = translator.workers
        print(f"{mode}: precision {choice.reason}; {translator.workers} worker(s)", flush=True)
        out, err = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        if mode == "filter":
            run_filter(translator, io.BytesIO(raw), out, err, beam=args.beam)
        else:
            translate_lines(translator, io.BytesIO(raw), Writers(out, 1, None, False, False),
                            err, beam=args.beam, batch_tokens=args.batch_tokens)
        seconds = time.perf_counter() - start
        outputs[mode] = out.getvalue().splitlines()
        record[mode] = {"seconds": round(seconds, 1),
                        "lines_per_s": round(len(sources) / seconds, 2)}
        print(f"{mode}: {len(sources)} lines in {seconds:.1f} s "
              f"({len(sources) / seconds:.2f} lines/s, {threads[mode]} threads)", flush=True)
    record["native"] = native.status()  # the kernels' build and each choice made in this run
    print(f"native kernels: {record['native']}")
    if set(modes) >= {"filter", "file"}:
        same = sum(a == b for a, b in zip(outputs["filter"], outputs["file"], strict=True))
        record["same_output_lines"] = same
        record["speedup"] = round(record["filter"]["seconds"] / record["file"]["seconds"], 2)
        print(f"file mode x{record['speedup']} the filter; identical output on {same} of "
              f"{len(sources)} lines")
    print(f"CPU {record['cpu']['model']} {record['cpu']['flags']}, {cores} cores")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
