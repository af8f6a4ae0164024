"""`scripts/benchmark.py --minutes M`: test BLEU along equal wall-clock training.

Both toolkits train M minutes per JoeyNMT arm; test BLEU (beam 5 and greedy, sacrebleu on
detokenized text against the corpus's target side) and decoding sentences/s of the model
as it is at marks K, 2K, ... up to M minutes (`--mark-minutes K`, default 5; 0 = at M only;
M itself is always a mark) are read on a subset of the test split (`--mark-sentences N`,
every k-th sentence; default `--decode-sentences`), and on the whole split at the last
mark with `--full-test-at-end`. One line per mark is printed, and the `--json` file is
rewritten after each, so a killed run keeps every mark it measured.
`scripts/plot_bleu_minutes.py` plots BLEU against minutes from that file.

Ours: one `seq2seq-train` process per mark: `model/attention=ARM train.max_minutes=K` into a
fresh run folder (our defaults otherwise), then the same folder resumed with
`train.resume=true train.max_minutes=2K`, and so on. max_minutes bounds the run's
training-loop wall time summed over all resumes (`Progress.elapsed_s`, kept in every
checkpoint; dev validations inside the loop count, as in one uninterrupted run), so
process start-up, the dev validation every run ends with (outside the clock in one run as
well) and the decoding between segments do not count. A resume continues exactly (same
batches, RNG states, optimizer); what a segmented run adds is that dev validation at each
mark, which the plateau learning-rate schedule and early-stopping patience also see.
Each mark's weights (``last.pt`` without the optimizer state) are kept in
``<run>/marks/<K>min.pt`` (with the run's tokenizer/) and decoded from there.
Or `--ours-run ARM=DIR`: that run's best.pt, one mark at M.

JoeyNMT (scripts/bench_bleu_joey.py) has no time limit, so one `joeynmt train` run is
watched and stopped by the clock: it validates (20 dev pairs) and saves ``<updates>.ckpt``
about every K/5 minutes (validation_freq from its training tokens/s measured earlier in the
same benchmark run; ``keep_best_ckpts: -1`` keeps every checkpoint, any positive value
would delete all but the best by its validation metric), and gets Ctrl-C once a checkpoint
has trained past M minutes. Its time at each checkpoint is read from its log's timestamps:
from its first epoch's start to the save (`train_wall_s`, validations included) and the same
less its validations (`train_s`). Each mark takes the first checkpoint whose `train_s`
reaches the mark, so JoeyNMT trains at least the mark's minutes (up to about K/5 more);
`joeynmt test` then decodes it (``testing.load_model``) and the checkpoints between marks
are deleted.

Our max_minutes counts our in-loop dev validations (every train.valid_every steps and at
each epoch's end: 300 dev sentences decoded), JoeyNMT's marks do not count its own, and
its marks land at or past the mark: the budget leans toward JoeyNMT; both times are
recorded for every mark.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_ours
import sacrebleu

from seq2seq.atomic import write_json
from seq2seq.errors import ConfigError, Seq2SeqError

DEFAULT_MARK_MINUTES = 5.0
TOOLKITS = {"ours": "ours", "joey": "JoeyNMT"}


# ---------------------------------------------------------------- the schedule


def mark_schedule(minutes: float, every: float) -> list[float]:
    """Minutes at which test BLEU is read: every, 2 x every, ... up to ``minutes``, and
    ``minutes`` itself; ``every`` 0 (or >= minutes) reads it at ``minutes`` only."""
    if minutes <= 0:
        raise ConfigError(f"--minutes must be > 0 for BLEU marks, got {minutes:g}")
    if every < 0:
        raise ConfigError(f"--mark-minutes must be >= 0, got {every:g}")
    if every == 0 or every >= minutes:
        return [float(minutes)]
    n = int(minutes / every + 1e-9)
    marks = [round(every * i, 6) for i in range(1, n + 1)]
    if minutes - marks[-1] > 1e-6:
        marks.append(float(minutes))
    return marks


def mark_settings(args: argparse.Namespace) -> tuple[float, int]:
    """(--mark-minutes, --mark-sentences) with their defaults resolved."""
    every = DEFAULT_MARK_MINUTES if getattr(args, "mark_minutes", None) is None else args.mark_minutes
    sentences = getattr(args, "mark_sentences", None)
    return every, args.decode_sentences if sentences is None else sentences


# ---------------------------------------------------------------- records


def bleu(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    metric = sacrebleu.BLEU()
    score = metric.corpus_score(hyps, [refs])
    return {"bleu": score.score, "signature": str(metric.get_signature())}


def mark_record(minutes: float, steps: int, train_wall_s: float, train_s: float,
                decoded: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One mark of one toolkit: training so far and the test decoding of the weights then.
    ``decoded``: {"beam5": {...}, "greedy": {...}} with bleu, sent_per_s, seconds, sentences."""
    return {"minutes": minutes, "steps": steps, "train_wall_s": train_wall_s, "train_s": train_s,
            "bleu_beam5": decoded["beam5"]["bleu"], "bleu_greedy": decoded["greedy"]["bleu"],
            "beam5_sent_per_s": decoded["beam5"]["sent_per_s"],
            "greedy_sent_per_s": decoded["greedy"]["sent_per_s"],
            "beam5_seconds": decoded["beam5"]["seconds"], "greedy_seconds": decoded["greedy"]["seconds"],
            "sentences": decoded["beam5"]["sentences"], "signature": decoded["beam5"]["signature"],
            **extra}


def format_mark(arm: str, toolkit: str, mark: dict[str, Any]) -> str:
    line = (f"{mark['minutes']:g} min mark, {arm}, {TOOLKITS.get(toolkit, toolkit)}: "
            f"{mark['steps']} steps, {mark['train_wall_s'] / 60:.2f} min training "
            f"({mark['train_s'] / 60:.2f} in steps); test BLEU beam5 {mark['bleu_beam5']:.2f} "
            f"greedy {mark['bleu_greedy']:.2f} ({mark['sentences']} sentences); sent/s beam5 "
            f"{mark['beam5_sent_per_s']:.1f} greedy {mark['greedy_sent_per_s']:.1f}")
    full = mark.get("full_test")
    if full:
        line += (f"; whole test split ({full['sentences']}): BLEU beam5 {full['bleu_beam5']:.2f}, "
                 f"beam5 {full['beam5_sent_per_s']:.1f} sent/s")
    return line


class MarkLog:
    """The equal-time section of the results, filled one mark at a time: each mark is
    printed as one line and the whole results JSON is rewritten at once (atomically)."""

    def __init__(self, results: dict[str, Any], json_path: str | None, section: dict[str, Any]) -> None:
        self.results, self.path, self.section = results, json_path, section
        section.setdefault("arms", {})
        results["equal_time"] = section
        self.write()

    def arm(self, arm: str) -> dict[str, Any]:
        return self.section["arms"].setdefault(arm, {})

    def toolkit(self, arm: str, toolkit: str) -> dict[str, Any]:
        return self.arm(arm).setdefault(toolkit, {"marks": []})

    def add(self, arm: str, toolkit: str, mark: dict[str, Any]) -> None:
        self.toolkit(arm, toolkit)["marks"].append(mark)
        print(format_mark(arm, toolkit, mark), flush=True)
        self.write()

    def write(self) -> None:
        if self.path:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.results, indent=2)


# ---------------------------------------------------------------- test sets


@dataclass
class TestSet:
    name: str  # a file-name tag: marks<N> | full
    sources: list[str]
    refs: list[str]


def test_sets(full: bench_ours.BenchData, mark_sentences: int, whole: bool
              ) -> tuple[TestSet, TestSet | None]:
    """The subset decoded at every mark (every k-th test sentence) and the whole split."""
    ids = bench_ours.decode_subset(len(full.test_sources), mark_sentences)
    subset = TestSet(f"marks{len(ids)}", [full.test_sources[i] for i in ids],
                     [full.test_refs[i] for i in ids])
    return subset, TestSet("full", full.test_sources, full.test_refs) if whole else None


def decode_ours(run_or_ckpt: str | Path, test: TestSet) -> dict[str, dict[str, Any]]:
    """Greedy and beam-5 BLEU and sentences/s of our model on ``test`` (after a warm-up)."""
    from seq2seq.inference.decode import decode
    from seq2seq.runs.checkpoint import load_model

    model, tokenizers, _ = load_model(run_or_ckpt)
    out: dict[str, dict[str, Any]] = {}
    for beam, key in ((1, "greedy"), (5, "beam5")):
        decode(model, tokenizers, test.sources[:8], beam=beam, progress=False)  # warm-up
        dec = decode(model, tokenizers, test.sources, beam=beam, progress=False)
        out[key] = {"sent_per_s": len(dec.hypotheses) / dec.seconds, "seconds": dec.seconds,
                    "sentences": len(dec.hypotheses), **bleu(dec.hypotheses, test.refs)}
    return out


def full_test_fields(decoded: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"sentences": decoded["beam5"]["sentences"],
            **{f"bleu_{k}": decoded[k]["bleu"] for k in ("beam5", "greedy")},
            **{f"{k}_sent_per_s": decoded[k]["sent_per_s"] for k in ("beam5", "greedy")}}


# ---------------------------------------------------------------- ours


def bench_ours_runs(args: argparse.Namespace) -> dict[str, str]:
    return dict(spec.partition("=")[::2] for spec in args.ours_run)


def run_summary(run_dir: str | Path) -> dict[str, Any]:
    """Our run's summary.json (steps, wall_time_s incl. validation, train_time_s steps only)."""
    from seq2seq.atomic import read_json

    return read_json(Path(run_dir) / "summary.json") or {}


def ours_segment_command(args: argparse.Namespace, arm: str, run_dir: Path, minutes: float,
                         first: bool) -> list[str]:
    """`seq2seq-train` for one segment: a fresh run up to the first mark, then resumes whose
    max_minutes is the next mark (the clock sums over resumes). The run trains in the
    benchmark's --precision (a resume keeps the precision it started with). A resume takes
    the folder's config.yaml and may change budget keys only, so it gets no data or model
    overrides."""
    cmd = [sys.executable, "-c", "from seq2seq.cli import train_main; train_main()",
           f"run_dir={run_dir}", f"train.max_minutes={minutes:g}", f"train.threads={args.threads}"]
    if first:
        return [*cmd, f"model/attention={arm}", "train.overwrite=true",
                f"train.batch_tokens={args.batch_tokens}", "train.device=cpu",
                f"train.precision={getattr(args, 'precision', 'fp32')}", *args.data]
    return [*cmd, "train.resume=true"]


def keep_mark_weights(run_dir: Path, marks_dir: Path, minutes: float) -> Path:
    """``last.pt`` (the weights at the mark) without optimizer/RNG state, as
    ``marks/<minutes>min.pt``, next to a copy of the run's tokenizer/ so it loads alone."""
    from seq2seq.runs.checkpoint import LAST, TOKENIZER_DIR, atomic_save, load_checkpoint

    marks_dir.mkdir(parents=True, exist_ok=True)
    if not (marks_dir / TOKENIZER_DIR).is_dir():
        shutil.copytree(run_dir / TOKENIZER_DIR, marks_dir / TOKENIZER_DIR)
    ckpt = load_checkpoint(run_dir / LAST)
    for key in ("optimizer", "scheduler", "rng", "rng_per_rank"):
        ckpt.pop(key, None)
    path = marks_dir / f"{minutes:g}min.pt"
    atomic_save(ckpt, path)
    return path


def train_ours_marks(args: argparse.Namespace, arm: str, work: Path, marks: list[float],
                     subset: TestSet, whole: TestSet | None, log: MarkLog) -> None:
    """Ours trained segment by segment, each mark decoded before the next segment starts."""
    given = bench_ours_runs(args).get(arm)
    side = log.toolkit(arm, "ours")
    if given:  # a run trained elsewhere: one mark, its best.pt
        summary = run_summary(given)
        side.update(run=given, summary=summary)
        extra = {"full_test": full_test_fields(decode_ours(given, whole))} if whole else {}
        log.add(arm, "ours", mark_record(
            args.minutes, summary.get("steps", 0), summary.get("wall_time_s", float("nan")),
            summary.get("train_time_s", float("nan")), decode_ours(given, subset),
            checkpoint=given, **extra))
        return
    run_dir = work / f"ours_{arm}_{args.minutes:g}min"
    marks_dir = run_dir / "marks"
    shutil.rmtree(marks_dir, ignore_errors=True)  # a fresh run: the old marks are stale
    side["run"] = str(run_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bench_ours.ROOT), os.environ.get("PYTHONPATH", "")])}
    for i, minutes in enumerate(marks):
        cmd = ours_segment_command(args, arm, run_dir, minutes, first=i == 0)
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=bench_ours.ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise Seq2SeqError(f"seq2seq-train for {arm} up to {minutes:g} min failed:\n"
                               f"{proc.stderr[-3000:]}")
        summary = run_summary(run_dir)
        side["summary"] = summary
        kept = keep_mark_weights(run_dir, marks_dir, minutes)
        extra = ({"full_test": full_test_fields(decode_ours(kept, whole))}
                 if whole and i == len(marks) - 1 else {})
        log.add(arm, "ours", mark_record(
            minutes, summary["steps"], summary["wall_time_s"], summary["train_time_s"],
            decode_ours(kept, subset), checkpoint=str(kept), process_wall_s=wall,
            stop_reason=summary["stop_reason"], best_dev_bleu=summary.get("best_dev_bleu"),
            **extra))


# ---------------------------------------------------------------- both


def final_ratios(entry: dict[str, Any]) -> dict[str, float]:
    """ours / JoeyNMT decoding sentences/s at the last mark (and on the whole split)."""
    ours, joey = entry["ours"]["marks"][-1], entry["joey"]["marks"][-1]
    out = {f"ratio_{k}_sent_per_s": ours[f"{k}_sent_per_s"] / joey[f"{k}_sent_per_s"]
           for k in ("beam5", "greedy")}
    if "full_test" in ours and "full_test" in joey:
        out.update({f"ratio_{k}_sent_per_s_full_test":
                    ours["full_test"][f"{k}_sent_per_s"] / joey["full_test"][f"{k}_sent_per_s"]
                    for k in ("beam5", "greedy")})
    return out


def equal_time_bleu(args: argparse.Namespace, work: Path, results: dict[str, Any]) -> dict[str, Any]:
    """Per JoeyNMT arm: both toolkits trained M minutes; BLEU and decoding speed at each mark."""
    every, mark_sentences = mark_settings(args)
    marks = mark_schedule(args.minutes, every)
    cfg = bench_ours.bench_config(args.data, "bahdanau", args.batch_tokens, "fp32", args.threads)
    args.langs = [cfg.data.src_lang, cfg.data.tgt_lang]
    full = bench_ours.load_bench_data(cfg, 0)
    subset, whole = test_sets(full, mark_sentences, getattr(args, "full_test_at_end", False))
    section = {"minutes": args.minutes, "mark_minutes": every, "marks": marks,
               "test_sentences": len(subset.sources), "test_split_sentences": len(full.test_sources),
               "full_test_at_end": whole is not None, "threads": args.threads}
    log = MarkLog(results, args.json, section)
    from bench_bleu_joey import train_joey_marks  # it builds on this module's records

    for arm in filter(None, args.joey_arms.split(",")):
        train_ours_marks(args, arm, work, marks, subset, whole, log)
        train_joey_marks(args, arm, work, marks, every, results, subset, whole, log)
        entry = log.arm(arm)
        entry.update(final_ratios(entry))
        log.write()
        ours, joey = entry["ours"]["marks"][-1], entry["joey"]["marks"][-1]
        print(f"{marks[-1]:g} min, {arm}: test BLEU (beam 5) ours {ours['bleu_beam5']:.2f} vs "
              f"JoeyNMT {joey['bleu_beam5']:.2f} ({joey['steps']} updates); trained-model decoding "
              f"ours/joey: beam5 x{entry['ratio_beam5_sent_per_s']:.2f}, greedy "
              f"x{entry['ratio_greedy_sent_per_s']:.2f}"
              + (f"; whole test split beam5 x{entry['ratio_beam5_sent_per_s_full_test']:.2f}"
                 if "ratio_beam5_sent_per_s_full_test" in entry else ""), flush=True)
    return section
