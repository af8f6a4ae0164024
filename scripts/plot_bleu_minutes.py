"""Test BLEU (beam 5) against training minutes, from `scripts/benchmark.py --minutes M --json FILE`.

    PYTHONPATH=. .venv/bin/python scripts/plot_bleu_minutes.py \\
        --json runs/benchmark/minutes.json --out docs/bleu_per_minute.png

One line per toolkit and attention arm, a point per mark (`--mark-minutes`); `--json`
may be given once per run (say one arm each), and runs are drawn together only when they
come from the same CPU, decoded the same number of test sentences and hold different arms.
The x axis is
the training time each toolkit had actually used at the mark (``train_wall_s``: ours the
training loop's wall time that train.max_minutes bounds, JoeyNMT's from its log, both with
their dev validations), or with `--x nominal` the mark's nominal minutes. The title
names the CPU and thread count recorded in the JSON, and the instruction-set caps of a
capped run (an AVX2 stand-in).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from seq2seq.errors import ConfigError, Seq2SeqError  # noqa: E402

NAMES = {"ours": "seq2seq (ours)", "joey": "JoeyNMT 2.3.0"}
STYLES = ["-", "--", ":", "-."]


def load_results(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except ValueError as err:
        raise ConfigError(f"{path} is not JSON ({err})") from None


def merge_results(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Several runs' results as one: their arms side by side. ConfigError when they were
    measured on different CPUs (figures from different machines are never mixed), on
    different numbers of test sentences, or hold the same arm twice."""
    (first_src, first), *rest = runs
    first_et = first.get("equal_time") or {}
    arms = dict(first_et.get("arms") or {})
    merged = {**first, "equal_time": {**first_et, "arms": arms}}
    owner = dict.fromkeys(arms, first_src)
    for src, res in rest:
        if res.get("cpu") != first.get("cpu"):
            raise ConfigError(f"{src} was measured on another CPU than {first_src} "
                              f"({res.get('cpu')} against {first.get('cpu')}): plot them apart")
        et = res.get("equal_time") or {}
        if et.get("test_sentences") != first_et.get("test_sentences"):
            raise ConfigError(f"{src} read BLEU on {et.get('test_sentences')} test sentences, "
                              f"{first_src} on {first_et.get('test_sentences')}: plot them apart")
        for arm, entry in (et.get("arms") or {}).items():
            if arm in arms:
                raise ConfigError(f"arm {arm!r} is in both {owner[arm]} and {src}: give one of them")
            arms[arm], owner[arm] = entry, src
    return merged


def series(results: dict[str, Any], x: str = "wall") -> list[tuple[str, str, list[float], list[float]]]:
    """(toolkit, arm, minutes, BLEU beam 5) per toolkit x arm that has marks."""
    arms = (results.get("equal_time") or {}).get("arms") or {}
    out = []
    for arm, entry in arms.items():
        for toolkit, side in entry.items():
            marks = side.get("marks") if isinstance(side, dict) else None
            if not marks:
                continue
            xs = [m["minutes"] if x == "nominal" else m["train_wall_s"] / 60 for m in marks]
            out.append((toolkit, arm, xs, [m["bleu_beam5"] for m in marks]))
    return out


def cpu_title(results: dict[str, Any]) -> str:
    """The CPU model and threads, and the instruction-set caps when the run had any (a
    capped run stands in for another kind of CPU, and its figure must say so)."""
    cpu = results.get("cpu") or {}
    model = cpu.get("model", "unknown CPU") if isinstance(cpu, dict) else str(cpu)
    threads = (results.get("equal_time") or {}).get("threads") or (results.get("args") or {}).get("threads")
    caps = cpu.get("isa_caps") if isinstance(cpu, dict) else None
    capped = f", capped to {cpu.get('kernels') or 'fewer'} instructions" if caps else ""
    return model + (f", {threads} threads" if threads else "") + capped


def plot(results: dict[str, Any], out: str | Path, x: str = "wall", source: str = "") -> Path:
    """Write the PNG (any suffix matplotlib knows); ConfigError when the results hold no marks."""
    from matplotlib.figure import Figure

    from seq2seq.atomic import save_figure

    lines = series(results, x)
    if not lines:
        raise ConfigError(f"no BLEU marks in {source or 'the results'}: run scripts/benchmark.py "
                          "--minutes M [--mark-minutes K] --json FILE first (its equal_time.arms)")
    toolkits = list(dict.fromkeys(t for t, *_ in lines))
    arms = list(dict.fromkeys(a for _, a, *_ in lines))
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    for toolkit, arm, xs, ys in lines:
        ax.plot(xs, ys, marker="o", color=f"C{toolkits.index(toolkit)}",
                linestyle=STYLES[arms.index(arm) % len(STYLES)],
                label=f"{NAMES.get(toolkit, toolkit)}, {arm}")
    et = results.get("equal_time") or {}
    ax.set_xlabel("training minutes (nominal mark)" if x == "nominal" else
                  "training minutes (wall time of the training loop)")
    ax.set_ylabel(f"test BLEU, beam 5 ({et.get('test_sentences', '?')} sentences)")
    ax.set_title(f"Test BLEU by training time\n{cpu_title(results)}", fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=120)
    return Path(out)


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, action="append",
                   help="results of scripts/benchmark.py --minutes M --json FILE (repeatable)")
    p.add_argument("--out", default="docs/bleu_per_minute.png", help="the image to write")
    p.add_argument("--x", choices=("wall", "nominal"), default="wall",
                   help="x axis: training time used at each mark (wall) or the mark's minutes")
    args = p.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results = merge_results([(path, load_results(path)) for path in args.json])
    out = plot(results, args.out, args.x, source=", ".join(args.json))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    try:
        main()
    except Seq2SeqError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
