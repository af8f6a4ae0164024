"""The reproduction's verdicts and ``report.md``, from the results dict of :mod:`seq2seq.experiments.reproduce`.

``results`` holds ``arms`` (name -> training summary + ``parameters`` + ``spec``),
``splits`` (split -> ``{"count", "scores": {system: score_buckets result},
"comparisons": {baseline: paired_test result}, "trends": {baseline: {arm: trend}}}``),
``apertium`` (its version or None), ``timings``, ``config`` and ``command``.
With several seeds (``results["seeds"]``), ``splits`` holds the :mod:`seq2seq.experiments.seeds`
aggregate (scores are seed means with ``sd``, ``lo``/``hi`` the min/max over seeds;
comparisons and trends pooled over seeds), ``per_seed`` each seed's own ``splits``, and
each arm has ``per_seed`` summaries; the criteria are then judged on the seed means.
Nothing here computes a score: every number comes from that dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from seq2seq.corpus.buckets import BUCKET_LABELS
from seq2seq.evaluation import tables as report
from seq2seq.experiments.verdict import (
    ALPHA,
    attention_arms,
    per_seed_table,
    trend_passes,
    verdict_paragraph,
)

APERTIUM = "apertium"
MIN_RELATIVE_GAIN = 0.30  # docs/evaluation-protocol.md#criterion-1-attention-beats-the-fixed-vector
TEST, TEST_LONG = "test", "test_long"


def _bleu(scope: Mapping[str, Any]) -> float | None:
    return None if scope.get("BLEU") is None else scope["BLEU"]["score"]


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


# -------------------------------------------------------------------- criteria
def _gain(results: Mapping[str, Any], arm: str, base: str) -> dict[str, Any]:
    split = results["splits"][TEST]
    a = _bleu(split["scores"][arm]["overall"])
    b = _bleu(split["scores"][base]["overall"])
    p = split["comparisons"][base]["systems"][arm]["overall"]["BLEU"]["p_value"]
    rel = (a / b - 1.0) if b else (math.inf if a else math.nan)
    verdict = "PASS" if rel >= MIN_RELATIVE_GAIN else "FAIL"
    return {"id": 1, "system": arm, "verdict": verdict, "value": rel,
            "detail": f"{arm} {_fmt(a)} vs {base} {_fmt(b)} BLEU: {rel:+.0%} relative "
                      f"(needs >= +{MIN_RELATIVE_GAIN:.0%}); paired p = {p:.3f}"}


def _trend(results: Mapping[str, Any], arm: str, base: str) -> dict[str, Any]:
    trend = results["splits"][TEST]["trends"][base][arm]
    if "error" in trend:
        return {"id": 2, "system": arm, "verdict": "N/A", "value": None, "detail": trend["error"]}
    return {"id": 2, "system": arm, "verdict": "PASS" if trend_passes(trend) else "FAIL",
            "value": trend["diff"],
            "detail": report.trend_summary(trend)}


def _beats_apertium(results: Mapping[str, Any], arm: str) -> dict[str, Any]:
    scores = results["splits"][TEST]["scores"]
    mine, theirs = scores[arm], scores[APERTIUM]
    scopes = [("all", mine["overall"], theirs["overall"])] + [
        (label, mine["buckets"][label], theirs["buckets"][label]) for label in BUCKET_LABELS
        if mine["buckets"][label]["count"]]
    lost = [f"{label} ({_fmt(_bleu(m))} vs {_fmt(_bleu(t))})" for label, m, t in scopes
            if not (_bleu(m) or 0.0) > (_bleu(t) or 0.0)]
    detail = (f"{arm} {_fmt(_bleu(mine['overall']))} vs Apertium "
              f"{_fmt(_bleu(theirs['overall']))} BLEU overall; "
              + ("above it in every non-empty bucket" if not lost
                 else "not above it in: " + ", ".join(lost)))
    return {"id": 4, "system": arm, "verdict": "FAIL" if lost else "PASS",
            "value": len(lost), "detail": detail}


def criteria(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The four criteria, judged from the numbers: one row per criterion and arm
    (docs/evaluation-protocol.md#the-four-criteria).

    1: attention >= +30% relative BLEU over its baseline on test; 2: the attention/none
    BLEU ratio is higher on 41+ words than on 11-20, significantly (one-sided p < 0.05);
    3: test_long BLEU and length ratio per system (a diagnostic, REPORTED); 4: the
    attention arms beat Apertium overall and in every non-empty bucket of test.
    """
    rows: list[dict[str, Any]] = []
    pairs = attention_arms(results)
    if TEST in results["splits"]:
        rows += [_gain(results, arm, base) for arm, base in pairs]
        rows += [_trend(results, arm, base) for arm, base in pairs]
    if TEST_LONG in results["splits"]:
        for name, scores in results["splits"][TEST_LONG]["scores"].items():
            o = scores["overall"]
            rows.append({"id": 3, "system": name, "verdict": "REPORTED", "value": _bleu(o),
                         "detail": f"BLEU {_fmt(_bleu(o))}, output/reference length ratio "
                                   f"{_fmt(o['length_ratio'], 3)} (n={o['count']})"})
    if TEST in results["splits"]:
        if APERTIUM in results["splits"][TEST]["scores"]:
            rows += [_beats_apertium(results, arm) for arm, _ in pairs]
        else:
            rows.append({"id": 4, "system": "-", "verdict": "SKIPPED", "value": None,
                         "detail": "Apertium is not installed (apt-get install apertium "
                                   "apertium-eng-spa)"})
    return sorted(rows, key=lambda r: r["id"])


# ---------------------------------------------------------------------- report
CRITERIA_TEXT = {
    1: "attention beats none by >= 30% relative BLEU on test",
    2: "attention/none BLEU ratio grows with source length (41+ vs 11-20, p < 0.05)",
    3: "test_long (60-120 words, beyond the training cap): BLEU and length ratio",
    4: "attention arms beat Apertium overall and in every bucket",
}


def _what_was_run(results: Mapping[str, Any]) -> list[str]:
    c = results["config"]
    m, t, d, ev = c["model"], c["train"], c["data"], c["eval"]
    counts = ", ".join(f"{s} n={r['count']}" for s, r in results["splits"].items())
    budget = [f"{t['max_minutes']:g} min" if t["max_minutes"] else "",
              f"{t['max_steps']} steps" if t["max_steps"] else "", f"{t['max_epochs']} epochs"]
    return [
        "## What was run", "",
        f"- Command: `{results['command']}` (profile `{results['profile']}`); resolved config "
        f"in `reproduce_config.yaml`, each arm's in `arms/<arm>/"
        f"{'seed<k>/' if results.get('seeds') else ''}config.yaml`.",
        f"- Corpus: `{d['name']}` ({d['src_lang']}→{d['tgt_lang']}); evaluated on {counts}.",
        f"- Model, shared by the arms: {m['rnn_type'].upper()}, embeddings {m['emb_size']}, "
        f"hidden {m['hidden_size']}, {m['enc_layers']}+{m['dec_layers']} layers, dropout "
        f"{m['dropout']}; SentencePiece vocabulary {c['tokenizer']['vocab_size']} per side.",
        f"- Training, shared: {_seed_text(results)}, {t['batch_tokens']} target tokens per batch, "
        f"lr {t['lr']} ({t['lr_schedule']}), budget per arm: "
        f"{', '.join(b for b in budget if b)} (whichever comes first), device {t['device']}"
        f", precision {t.get('precision', 'fp32')}{_resolved_precision(results)}.",
        f"- Decoding: beam {ev['beam']}, length penalty α={ev['alpha']}, output cap "
        f"{ev['max_len_ratio']}×source+{ev['max_len_extra']} subwords. Intervals and tests: "
        f"{ev['n_boot']} bootstrap resamples, seed {ev['boot_seed']}.",
        f"- Apertium: {results['apertium'] or 'not installed or disabled: row skipped'}.",
        f"- Wall time of this invocation: {results['wall_time_s'] / 60:.1f} min.", "",
    ]


def _resolved_precision(results: Mapping[str, Any]) -> str:
    """What ``train.precision`` became in the arms (auto measures per machine)."""
    summaries = [s for arm in results["arms"].values()
                 for s in (arm.get("per_seed") or {"": arm}).values()]
    used = sorted({s.get("precision") or "fp32" for s in summaries})
    return f" (trained in {', '.join(used)})" if used else ""


def _seed_text(results: Mapping[str, Any]) -> str:
    seeds = results.get("seeds")
    if not seeds:
        return f"seed {results['config']['train']['seed']}"
    return f"seeds {', '.join(map(str, seeds))} (every arm trained once per seed)"


def _arms_table(results: Mapping[str, Any]) -> list[str]:
    if results.get("seeds"):
        return _seeds_arms_table(results)
    lines = ["| arm | attention | trained on ≤ src words | parameters | steps | epochs | "
             "stopped by | training time | target tok/s | best dev BLEU |",
             "|" + "---|" * 10]
    for name, a in results["arms"].items():
        cap = a["spec"].get("max_src_words") or results["config"]["train"]["max_src_words"]
        lines.append(
            f"| {name} | {_attention_text(a)} | {cap} | {a['parameters']:,} | {a['steps']} | "
            f"{a['epochs_completed']} | {a['stop_reason']} | {a['wall_time_s'] / 60:.1f} min | "
            f"{a['mean_tgt_tok_per_s']:,.0f} | {_fmt(a['best_dev_bleu'], 2)} |")
    return [*lines, ""]


def _attention_text(arm: Mapping[str, Any]) -> str:
    """The attention's name, and the config group it came from when that says more."""
    group = arm.get("spec", {}).get("attention")
    return arm["attention"] if group in (None, arm["attention"]) else f"{arm['attention']} (`{group}`)"


def _split_section(name: str, split: Mapping[str, Any], seeds: list[int] | None = None
                   ) -> list[str]:
    """The per-bucket tables of one split; with ``seeds``, mean ± sd and pooled tests."""
    scores = split["scores"]

    def table(systems: Mapping[str, Any], comparison: Mapping[str, Any] | None) -> str:
        if seeds:
            return seeds_table(systems, comparison, seeds)
        return report.markdown_table(systems, comparison)

    over, pooled, means = (" over seeds", ", pooled over seeds", ", seed means") if seeds else ("", "", "")
    lines = [f"## BLEU and chrF by source length{over}: {name}", ""]
    for baseline, comparison in split["comparisons"].items():
        members = [baseline, *comparison["systems"]]
        lines += [table({m: scores[m] for m in members}, comparison), ""]
        for arm, trend in split["trends"][baseline].items():
            text = trend.get("error") or report.trend_summary(trend)
            lines += [f"- {arm} vs {baseline}{pooled}: {text}"]
        lines.append("")
    if not split["comparisons"]:
        lines += [table(scores, None), ""]
    lines += [f"Output/reference length ratio and mean attention entropy (nats) per bucket{means}:",
              "", report.diagnostics_table(scores), ""]
    return lines


def _long_section(split: Mapping[str, Any]) -> list[str]:
    lines = ["## Beyond the training length: test_long", "",
             "| system | n | BLEU [95% CI] | chrF | length ratio | attention entropy |",
             "|---|---|---|---|---|---|"]
    for name, s in split["scores"].items():
        o = s["overall"]
        b = o["BLEU"]
        lines.append(f"| {name} | {o['count']} | {_fmt(b['score'])} [{_fmt(b['lo'])}, "
                     f"{_fmt(b['hi'])}] | {_fmt(o['chrF']['score'])} | "
                     f"{_fmt(o['length_ratio'], 3)} | {_fmt(o['attention_entropy'], 2)} |")
    return [*lines, ""]


def _criteria_section(rows: list[dict[str, Any]], seeds: bool = False) -> list[str]:
    lines = ["## Criteria (docs/evaluation-protocol.md)", ""]
    if seeds:
        lines += ["Judged on the seed means (BLEU, length ratio); p-values and the ratio "
                  "trend come from the tests pooled across seeds.", ""]
    lines += ["| # | criterion | system | verdict | measured |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {CRITERIA_TEXT[r['id']]} | {r['system']} | "
                     f"**{r['verdict']}** | {r['detail']} |")
    return [*lines, ""]


def _timings_section(timings: Mapping[str, Any]) -> list[str]:
    lines = ["## Timings", "", "| phase | seconds | note |", "|---|---|---|"]
    for phase, t in timings.items():
        note = "from an earlier run (reused)" if t["cached"] else ""
        lines.append(f"| {phase} | {t['seconds']:.1f} | {note} |")
    return [*lines, ""]


def render_report(results: Mapping[str, Any]) -> str:
    """``report.md``: what was run, arms, per-split tables, test_long, criteria, timings."""
    curves = results.get("curves_png")
    lines = [f"# BLEU versus source sentence length ({results['profile']} profile)", "",
             *verdict_paragraph(results),
             "Attention (Bahdanau, Luong) against the fixed-vector encoder-decoder (none), "
             "as in Bahdanau et al. 2015, Figure 2. Plot: `bleu_vs_length.png`"
             + (f"; how it formed during training (dev BLEU by length at every validation): "
                f"`{curves}`" if curves else "") + "; every number: `results.json`.", ""]
    lines += _what_was_run(results)
    lines += ["## Arms", "", *_arms_table(results)]
    seeds = results.get("seeds")
    for name, split in results["splits"].items():
        if seeds:
            lines += (_seeds_long_section(split) if name == TEST_LONG
                      else _split_section(name, split, seeds))
        else:
            lines += _long_section(split) if name == TEST_LONG else _split_section(name, split)
    if seeds:
        lines += _per_seed_section(results)
        lines += per_seed_table(results)
    lines += _criteria_section(results["criteria"], bool(seeds))
    lines += _timings_section(results["timings"])
    return "\n".join(lines)


# ------------------------------------------------------------------- several seeds
def _mean_sd(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "—"
    sd = cell.get("sd")
    return f"{_fmt(cell['score'])} ± {_fmt(sd)}" if sd is not None else _fmt(cell["score"])


def _p_cell(comparison: Mapping[str, Any] | None, system: str, label: str) -> str | None:
    if comparison is None or system not in comparison["systems"]:
        return None
    tested = comparison["systems"][system]
    scope = tested["overall"] if label == "all" else tested["buckets"][label]
    if scope.get("BLEU") is None:
        return "—"
    p = scope["BLEU"]["p_value"]
    return f"{p:.3f}" + ("*" if p < ALPHA else "")


def seeds_table(scores: Mapping[str, Any], comparison: Mapping[str, Any] | None,
                seeds: list[int]) -> str:
    """Per bucket: n, then per system BLEU and chrF as mean ± sd over the seeds and the
    pooled paired-bootstrap p-value of BLEU against the baseline (when it has one)."""
    systems = list(scores)
    tested = [s for s in systems if _p_cell(comparison, s, "all") is not None]
    header = ["Source words", "n"]
    for system in systems:
        header += [f"{system} BLEU", f"{system} chrF"] + ([f"{system} p"] if system in tested
                                                          else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in (*BUCKET_LABELS, "all"):
        first = scores[systems[0]]
        count = (first["overall"] if label == "all" else first["buckets"][label])["count"]
        cells = [label, str(count)]
        for system in systems:
            scope = (scores[system]["overall"] if label == "all"
                     else scores[system]["buckets"][label])
            cells += [_mean_sd(scope["BLEU"]), _mean_sd(scope["chrF"])]
            if system in tested:
                cells.append(_p_cell(comparison, system, label) or "—")
        lines.append("| " + " | ".join(cells) + " |")
    first = scores[systems[0]]
    lines += ["", f"Mean ± sample standard deviation over seeds {', '.join(map(str, seeds))} "
              "of each seed's corpus score per bucket."]
    if comparison is not None:
        lines.append(f"p: two-sided paired bootstrap of BLEU against {comparison['baseline']}, "
                     f"pooled over the seeds (each seed's arm paired with the same seed's "
                     f"baseline, {comparison['n_boot']} resamples of the (seed, sentence) "
                     "rows); * marks p < 0.05.")
    lines += [f"{m} signature: `{first['signatures'][m]}`" for m in ("BLEU", "chrF")]
    return "\n".join(lines)


def _seeds_long_section(split: Mapping[str, Any]) -> list[str]:
    lines = ["## Beyond the training length: test_long (mean ± sd over seeds)", "",
             "| system | n | BLEU | chrF | length ratio | attention entropy |",
             "|---|---|---|---|---|---|"]
    for name, s in split["scores"].items():
        o = s["overall"]
        lines.append(f"| {name} | {o['count']} | {_mean_sd(o['BLEU'])} | {_mean_sd(o['chrF'])} "
                     f"| {_fmt(o['length_ratio'], 3)} | {_fmt(o['attention_entropy'], 2)} |")
    return [*lines, "", "Length ratio and attention entropy: seed means.", ""]


def _seeds_arms_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["| arm | seed | attention | trained on ≤ src words | parameters | steps | "
             "stopped by | training time | target tok/s | best dev BLEU |", "|" + "---|" * 10]
    for name, arm in results["arms"].items():
        cap = arm["spec"].get("max_src_words") or results["config"]["train"]["max_src_words"]
        for seed, a in arm["per_seed"].items():
            lines.append(
                f"| {name} | {seed} | {_attention_text(a)} | {cap} | {a['parameters']:,} | "
                f"{a['steps']} | {a['stop_reason']} | {a['wall_time_s'] / 60:.1f} min | "
                f"{a['mean_tgt_tok_per_s']:,.0f} | {_fmt(a['best_dev_bleu'], 2)} |")
    return [*lines, ""]


def _per_seed_section(results: Mapping[str, Any]) -> list[str]:
    """Overall BLEU of every system on every split, one column per seed."""
    seeds = results["seeds"]
    lines = ["## Overall BLEU of each seed", "",
             "| split | system | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± sd |",
             "|" + "---|" * (len(seeds) + 3)]
    for split_name, split in results["splits"].items():
        for system, agg in split["scores"].items():
            bleu = agg["overall"]["BLEU"]
            per = bleu["per_seed"] if bleu else [None] * len(seeds)
            lines.append(f"| {split_name} | {system} | " + " | ".join(_fmt(b) for b in per)
                         + f" | {_mean_sd(bleu)} |")
    return [*lines, "", "Each seed's full tables: `scores_<split>_seed<k>.csv` and "
            "`results.json` (`per_seed`).", ""]
