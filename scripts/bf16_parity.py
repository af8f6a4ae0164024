"""bf16 parity: every arm trained N steps in fp32 and in bf16 from the same seed; dev loss compared.

    .venv/bin/python scripts/bf16_parity.py --steps 1000 --jobs 2 --out runs/bf16_parity
    ... --precision bf16_loss      # fp32 against bf16 for the output layer and loss only
    ... --precision bf16_gemm      # ... for those and the other large products

For each arm of the quick reproduction (``none``, ``bahdanau``, ``luong`` with the deep output
of ``model/attention=luong_deep``) it runs ``seq2seq-train`` twice with the same seed, batches
and recipe, ``train.precision=fp32`` and ``train.precision=bf16`` (or ``--precision``'s
choice), validates once at step N and
reads the dev loss (the summed cross-entropy per dev target token) from each run's
``metrics.csv``. An arm passes when the bf16 dev loss is within ``--tolerance`` (relative) of
fp32's. Runs already finished in ``--out`` are read, not trained again, so a stopped
measurement continues where it was. ``--jobs 2`` trains two runs side by side with one thread
each: the losses, not the speed, are measured here. Writes ``parity.json`` (commands, CPU,
per-arm losses) and prints a Markdown table; exits 1 when an arm is outside the tolerance.

A process would time some paths at start-up (the fp32 GEMM route, the C kernels against
torch's ops), and they round differently, so a pair whose two processes took different paths
would differ by more than the precision. Every run here trains with ``train.deterministic=true``
(those paths fixed, not timed); the table and ``parity.json`` still name any path a pair took
differently, from each run's ``summary.json`` (docs/performance.md#the-large-products-in-bf16).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
# arm name -> model/attention choice: the arms of configs/profile/quick.yaml
ARMS = {"none": "none", "bahdanau": "bahdanau", "luong": "luong_deep"}
PRECISIONS = ("fp32", "bf16")
COMPARED = ("bf16", "bf16_loss", "bf16_gemm")  # what --precision compares with fp32


def train_command(arm: str, precision: str, steps: int, seed: int, threads: int,
                  run_dir: Path, extra: list[str]) -> list[str]:
    """The seq2seq-train call of one run: the quick profile's recipe, one validation at ``steps``."""
    return [str(Path(sys.executable).parent / "seq2seq-train"),
            f"model/attention={ARMS[arm]}", f"train.precision={precision}",
            f"train.seed={seed}", f"train.threads={threads}", f"train.max_steps={steps}",
            f"train.valid_every={steps}", "train.valid_at_epoch_end=false",
            "train.max_epochs=1000", "train.max_minutes=0", "train.lr_schedule=constant",
            "train.patience=0", "train.max_src_words=30", "train.valid_bleu_sentences=500",
            "train.device=cpu", "train.deterministic=true", "train.overwrite=true",
            f"run_dir={run_dir}", *extra]


def dev_loss_at(metrics: Path, step: int) -> float | None:
    """The dev loss a run's metrics.csv holds for ``step``; None if it has none (yet)."""
    if not metrics.exists():
        return None
    with metrics.open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["step"]) == step and row.get("dev_loss"):
                return float(row["dev_loss"])
    return None


def kernel_paths(run_dir: Path) -> dict[str, str] | None:
    """The paths a finished run's process timed and took (its ``summary.json``): the fp32
    GEMM route and each native kernel's choice. None for a run without them."""
    summary = run_dir / "summary.json"
    if not summary.exists():
        return None
    record = json.loads(summary.read_text())
    if "native_choices" not in record:
        return None
    return {"fp32 GEMMs": record.get("fp32_gemm", ""), **record["native_choices"]}


def differing(a: dict[str, str] | None, b: dict[str, str] | None) -> list[str] | None:
    """The paths two runs both timed but took differently (None: not known for both).
    Each path rounds differently, so such a pair differs by more than its precision."""
    if a is None or b is None:
        return None
    return [f"{k}: {a[k]} / {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]


def compare(fp32: float, other: float, tolerance: float, name: str = "bf16") -> dict[str, Any]:
    """The record of one arm: both losses (the other under ``name``), the other's relative
    difference, and whether it is within."""
    rel = (other - fp32) / fp32
    return {"fp32": fp32, name: other, "relative": rel, "within": abs(rel) <= tolerance}


def _run(cmd: list[str], log: Path) -> int:
    with log.open("w") as f:
        return subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode


def table(arms: dict[str, dict[str, Any]], steps: int, tolerance: float, name: str = "bf16") -> str:
    lines = [f"| arm | dev loss fp32 | dev loss {name} | {name} - fp32 | within {tolerance:.0%} "
             "| timed paths (fp32 / other) |", "|---|---|---|---|---|---|"]
    for arm, r in arms.items():
        paths = r.get("paths_differ")
        said = "not recorded" if paths is None else "; ".join(paths) if paths else "the same"
        lines.append(f"| {arm} | {r['fp32']:.4f} | {r[name]:.4f} | {r['relative']:+.2%} | "
                     f"{'yes' if r['within'] else 'NO'} | {said} |")
    return f"dev loss after {steps} steps\n\n" + "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--precision", default="bf16", choices=COMPARED,
                   help="the train.precision compared with fp32")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=0.01, help="relative, 0.01 = 1%%")
    p.add_argument("--jobs", type=int, default=2, help="runs trained side by side")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per run (0: the cores split between the jobs)")
    p.add_argument("--out", default="runs/bf16_parity")
    p.add_argument("extra", nargs="*", help="more seq2seq-train overrides for every run")
    args = p.parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        p.error(f"unknown arm(s) {', '.join(unknown)}: use {', '.join(ARMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from seq2seq.runtime import bf16_supported, cpu_description

    if not bf16_supported(torch.device("cpu")):
        print("this CPU has no native bf16 (AVX512-BF16 or AMX): train.precision=bf16(_loss) would "
              "train in fp32 here, so there is nothing to compare; run it on such a CPU",
              file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    threads = args.threads or max(1, (torch.get_num_threads() // args.jobs))
    arms = args.arms.split(",")
    runs = {(a, p): out / f"{a}_{p}" for a in arms for p in ("fp32", args.precision)}
    cmds = {key: train_command(key[0], key[1], args.steps, args.seed, threads, d, args.extra)
            for key, d in runs.items()}
    logs = {key: d.with_name(d.name + ".log") for key, d in runs.items()}
    todo = [key for key, d in runs.items() if dev_loss_at(d / "metrics.csv", args.steps) is None]
    for key in todo:
        print(f"training {key[0]} {key[1]}: {' '.join(cmds[key])}", flush=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        codes = dict(zip(todo, pool.map(lambda k: _run(cmds[k], logs[k]), todo), strict=True))
    failed = [k for k, c in codes.items() if c != 0]
    if failed:
        names = ", ".join(f"{a} {p} (log {logs[a, p]})" for a, p in failed)
        print(f"training failed: {names}", file=sys.stderr)
        return 2
    losses = {key: dev_loss_at(d / "metrics.csv", args.steps) for key, d in runs.items()}
    missing = [f"{a} {p}" for (a, p), v in losses.items() if v is None]
    if missing:
        print(f"no dev loss at step {args.steps} in: {', '.join(missing)}", file=sys.stderr)
        return 2
    result = {a: compare(losses[a, "fp32"], losses[a, args.precision], args.tolerance,
                         args.precision) for a in arms}
    for a, r in result.items():
        r["paths"] = {p: kernel_paths(runs[a, p]) for p in ("fp32", args.precision)}
        r["paths_differ"] = differing(*r["paths"].values())
        if r["paths_differ"]:
            print(f"{a}: the two runs' processes timed different paths "
                  f"({'; '.join(r['paths_differ'])}), so their difference is not the precision's "
                  "alone (to try again: delete one of the two run folders in --out)", file=sys.stderr)
    record = {"steps": args.steps, "seed": args.seed, "tolerance": args.tolerance,
              "precision": args.precision,
              "threads_per_run": threads, "cpu": cpu_description(), "arms": result,
              "commands": {f"{a} {p}": " ".join(c) for (a, p), c in cmds.items()}}
    (out / "parity.json").write_text(json.dumps(record, indent=2) + "\n")
    print(table(result, args.steps, args.tolerance, args.precision))
    return 0 if all(r["within"] for r in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
