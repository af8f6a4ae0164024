"""train.precision=auto's start-up probe: one batch repeated against a new batch each round.

    PYTHONPATH=. .venv/bin/python scripts/bench_probe.py --arm bahdanau --how new [--json out.json]

Builds the benchmark's model and batches (scripts/bench_ours.py: GRU 256, 8k+8k
SentencePiece, 3,000 target tokens per batch), picks the fp32 GEMM route as seq2seq-train
does, then runs :func:`seq2seq.precision.probe` once: ``--how repeat`` times every
precision on the first batch again and again (the probe before stop 39), ``--how new``
warms up on the first batch and times each round on a batch new to every precision (the
probe seq2seq-train runs now). Run each in its own process: the kernels one builds would
serve the other. Prints the median time per pass in each precision and the ratios that
``auto`` compares (docs/performance.md#the-probe-on-new-batches); compare them with
steady-state rates, e.g. scripts/benchmark.py's rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_ours  # noqa: E402

from seq2seq import precision  # noqa: E402
from seq2seq.corpus import batching  # noqa: E402
from seq2seq.model import gemm  # noqa: E402
from seq2seq.model.loss import chunk_shapes  # noqa: E402
from seq2seq.runtime import (  # noqa: E402
    bf16_supported,
    cpu_description,
    flush_denormals,
    keep_freed_memory,
)
from seq2seq.training.loop import training_pass  # noqa: E402


def probe_arm(arm: str, how: str, threads: int, data: list[str], batch_tokens: int = 3000
              ) -> dict[str, object]:
    """The probe's median seconds per precision for ``arm``, the way ``how`` says."""
    torch.set_num_threads(threads)
    cfg = bench_ours.bench_config(data, arm, batch_tokens, "auto", threads, True)
    keep_freed_memory()
    flush_denormals()
    bench = bench_ours.load_bench_data(cfg, 0)
    run = bench_ours.make_run(cfg, bench)
    route = gemm.choose(run.device, chunk_shapes(run.model), gemm.step_probe(run.model))
    d = bench.data
    idx = batching.train_batches(d.train, d.train_idx, cfg.train.batch_tokens, cfg.train.seed, 0)
    batches = [batching.collate(d.train, i) for i in idx[:precision.PROBE_BATCHES]]
    if how == "repeat":
        passes, sizes = training_pass(run, batches[0]), None
    else:
        passes, sizes = [training_pass(run, b) for b in batches], [b.n_tgt_tokens for b in batches]
    with gemm.using(route):
        rounds = precision.probe_rounds(passes, run.device, precision.TRAIN_MODES, sizes)
    seconds = precision.medians(rounds)
    return {"arm": arm, "how": how, "threads": threads, "cpu": cpu_description(),
            "fp32_gemm": route.name, "bf16_native": bf16_supported(run.device), "seconds": seconds,
            "rounds": rounds, "redone_on_busy_cores": rounds.redone, "still_busy": rounds.busy,
            "more_rounds_for": rounds.extended, "more_rounds": precision.more_rounds_note(rounds),
            "speedup_over_fp32": {m: precision.speedup(rounds, "fp32", m) for m in rounds},
            "chosen": precision._pick(rounds, "a training pass").name}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=bench_ours.ARMS, default="bahdanau")
    p.add_argument("--how", choices=("repeat", "new"), default="new")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=3000, help="real target tokens per batch")
    p.add_argument("--data", action="append", default=[], help="a data override, as benchmark.py's")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    rec = probe_arm(args.arm, args.how, args.threads, args.data, args.batch_tokens)
    ms = ", ".join(f"{m} {s * 1e3:.0f} ms" for m, s in rec["seconds"].items())
    ratios = ", ".join(f"{m} x{r:.2f}" for m, r in rec["speedup_over_fp32"].items() if m != "fp32")
    print(f"{rec['arm']} ({rec['how']}): {ms}; over fp32: {ratios} -> auto picks {rec['chosen']}")
    if rec["more_rounds"]:
        print(rec["more_rounds"])
    for key in ("redone_on_busy_cores", "still_busy"):
        if rec[key]:
            print(f"{key.replace('_', ' ')}: {', '.join(rec[key])}")
    if not rec["bf16_native"]:
        print("no native bf16 here: every precision ran in fp32 (seq2seq-train would not probe)")
    if args.json:
        Path(args.json).write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
