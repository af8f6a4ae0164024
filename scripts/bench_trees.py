"""Compare two checkouts' speed in one run: scripts/benchmark.py (ours only) from each tree,
alternating tree by tree for several rounds, so drift on a shared machine hits both.

    git worktree add ../before <commit>
    .venv/bin/python scripts/bench_trees.py --tree before=../before --tree after=. \
        --rounds 2 --json runs/bench_trees.json -- --arms bahdanau,luong --warmup 20

Everything after ``--`` goes to every scripts/benchmark.py call (``--no-joey`` and
``--json`` are added). The corpus is the one of this checkout (``data.root`` points
here for every tree), so both trees read the same built corpus and tokenizers.
Prints training target tokens/s and greedy / beam-5 sentences/s per arm, tree and round,
and each round's ratio of the last tree to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIELDS = (("train_tok_s", "train tok/s"), ("greedy_sent_s", "greedy sent/s"),
          ("beam5_sent_s", "beam-5 sent/s"))


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                   help="a checkout to measure (two or more, measured in this order)")
    p.add_argument("--rounds", type=int, default=2, help="rounds; each measures every tree once")
    p.add_argument("--json", default=None, help="write every round's results here")
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = p.parse_args(ours)
    trees = [t.split("=", 1) for t in args.tree]
    if len(trees) < 2 or any(len(t) != 2 or not Path(t[1], "scripts", "benchmark.py").is_file()
                             for t in trees):
        p.error("give two or more --tree NAME=PATH, each a checkout with scripts/benchmark.py")
    args.trees = [(name, Path(path).resolve()) for name, path in trees]
    return args, rest


def measure(tree: Path, extra: list[str], out: Path) -> dict[str, Any]:
    """One scripts/benchmark.py run (ours only) with ``tree``'s code; its JSON."""
    cmd = [sys.executable, str(tree / "scripts" / "benchmark.py"), "--no-joey", "--json", str(out),
           "--data", f"data.root={ROOT / 'data'}", "--work", str(out.parent / "work"), *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    return json.loads(out.read_text())


def arm_figures(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per arm: training target tok/s and greedy / beam-5 sentences/s."""
    figures = {}
    for arm, data in result["ours"].items():
        figures[arm] = {"train_tok_s": data["train"]["tgt_tok_per_s"],
                        "greedy_sent_s": data["greedy"]["sent_per_s"],
                        "beam5_sent_s": data["beam5"]["sent_per_s"]}
    return figures


def main(argv: list[str] | None = None) -> None:
    args, extra = parse_args(argv)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            row = {}
            for name, tree in args.trees:
                out = Path(tmp, f"{name}-{r}", "result.json")
                out.parent.mkdir(parents=True)
                result = measure(tree, extra, out)
                row[name] = {"figures": arm_figures(result), "load_average": result["load_average"]}
            rounds.append(row)
    first, last = args.trees[0][0], args.trees[-1][0]
    for r, row in enumerate(rounds, start=1):
        for arm in row[first]["figures"]:
            for key, label in FIELDS:
                values = "  ".join(f"{name} {row[name]['figures'][arm][key]:8.1f}"
                                   for name, _ in args.trees)
                ratio = row[last]["figures"][arm][key] / row[first]["figures"][arm][key]
                print(f"round {r}  {arm:9s} {label:14s} {values}  {last}/{first} x{ratio:.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        sys.path.insert(0, str(ROOT))
        from seq2seq.runtime import cpu_description

        Path(args.json).write_text(json.dumps({"cpu": cpu_description(),
                                               "trees": {n: str(p) for n, p in args.trees},
                                               "extra_args": extra, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
