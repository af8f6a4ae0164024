"""The report's first paragraph: what the reproduction showed, in plain words.

A newcomer reads this before any table. It says whether attention beat the fixed
vector, whether the bottleneck showed (criterion 2: the attention/none BLEU ratio grows
from 11-20-word to 41+-word sources), with the effect size (ratio on 41+ divided by the
ratio on 11-20; about 2 in Bahdanau et al.'s Figure 2) and, with several seeds, in how
many seeds it held. Every number comes from the results dict of :mod:`seq2seq.experiments.reproduce`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

ALPHA = 0.05  # significance level of criterion 2
TEST = "test"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def effect_size(trend: Mapping[str, Any]) -> float:
    """Ratio on the long group divided by the ratio on the short group (1 = no effect)."""
    rs, rl = trend.get("ratio_short", math.nan), trend.get("ratio_long", math.nan)
    return rl / rs if math.isfinite(rs) and math.isfinite(rl) and rs > 0 else math.nan


def trend_passes(trend: Mapping[str, Any]) -> bool:
    """Criterion 2 on one trend test: the long ratio is above the short one, p < 0.05."""
    if "error" in trend:
        return False
    rs, rl = trend["ratio_short"], trend["ratio_long"]
    return math.isfinite(rs) and math.isfinite(rl) and rl > rs and trend["p_value"] < ALPHA


def attention_arms(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(arm, its baseline) for every arm that is compared with a baseline."""
    return [(name, arm["spec"]["baseline"]) for name, arm in results["arms"].items()
            if arm["spec"].get("baseline")]


def per_seed_trends(results: Mapping[str, Any], arm: str, base: str) -> dict[int, Mapping[str, Any]]:
    """Each seed's own criterion-2 test on test ({} for a one-seed run)."""
    out = {}
    for seed, splits in (results.get("per_seed") or {}).items():
        trend = splits.get(TEST, {}).get("trends", {}).get(base, {}).get(arm)
        if trend is not None:
            out[int(seed)] = trend
    return out


def _arm_sentence(results: Mapping[str, Any], arm: str, base: str) -> tuple[str, bool]:
    split = results["splits"][TEST]
    a = split["scores"][arm]["overall"]["BLEU"]["score"]
    b = split["scores"][base]["overall"]["BLEU"]["score"]
    trend = split["trends"][base][arm]
    if "error" in trend:
        return f"{arm} scores {a:.1f} BLEU against {base}'s {b:.1f}; {trend['error']}", False
    shows = trend_passes(trend)
    seeds = per_seed_trends(results, arm, base)
    seed_text = ""
    if seeds:
        held = sum(trend_passes(t) for t in seeds.values())
        seed_text = f", pooled over seeds; it holds on its own in {held} of {len(seeds)} seeds"
    gain = f"{a:.1f} BLEU against {base}'s {b:.1f} ({(a / b - 1) if b else math.inf:+.0%})"
    ratio = (f"×{_fmt(trend['ratio_short'])} on {trend['short']}-word sources and "
             f"×{_fmt(trend['ratio_long'])} on {trend['long']} (effect size "
             f"{_fmt(effect_size(trend))}, one-sided p = {trend['p_value']:.3f}{seed_text})")
    if shows:
        text = (f"**{arm}: the bottleneck shows.** {arm} scores {gain}, and its advantage grows "
                f"with length: {ratio}.")
    else:
        text = (f"**{arm}: the bottleneck does not show.** {arm} scores {gain}, but its advantage "
                f"does not grow significantly with length: {ratio}.")
    return text, shows


def verdict_paragraph(results: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the verdict per attention arm, then the profile's note on its budget."""
    arms = attention_arms(results)
    lines: list[str] = []
    if TEST in results["splits"] and arms:
        sentences = [_arm_sentence(results, arm, base) for arm, base in arms]
        lines += [" ".join(text for text, _ in sentences), ""]
        if not any(shows for _, shows in sentences):
            lines += ["In this run attention is better at every length, but the fixed-vector "
                      "arm does not fall away on long sentences as in Bahdanau et al.'s Figure 2. "
                      "`bleu_by_length_over_time.png` shows whether it was starting to.", ""]
        missed = [arm for (arm, _), (_, shows) in zip(arms, sentences, strict=True) if not shows]
        lines += _longer_profile(results, missed)
    note = results.get("config", {}).get("reproduce", {}).get("budget_note")
    if note:
        lines += [f"*About this budget:* {note}", ""]
    return lines


def steps_text(arm: Mapping[str, Any]) -> str:
    """The training steps an arm took: "1,751", or over seeds "1,751-1,910"."""
    steps = [s["steps"] for s in arm.get("per_seed", {}).values()] or [arm["steps"]]
    low, high = min(steps), max(steps)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def _longer_profile(results: Mapping[str, Any], missed: list[str]) -> list[str]:
    """The sentence naming the profile with more training per arm (the profile's
    ``longer_profile``) when an attention arm's length effect did not show."""
    longer = results.get("config", {}).get("reproduce", {}).get("longer_profile")
    if not missed or not longer or longer == results.get("profile"):
        return []
    took = ", ".join(f"{arm} {steps_text(results['arms'][arm])}" for arm in missed)
    return [f"Training steps in this budget: {took}. The `{longer}` profile trains every arm "
            f"longer on the same recipe: `seq2seq-reproduce profile={longer}` "
            f"(configs/profile/{longer}.yaml says what it showed, and where).", ""]


def per_seed_table(results: Mapping[str, Any]) -> list[str]:
    """Criterion 2 of every seed and pooled, per attention arm (multi-seed runs)."""
    seeds = results.get("seeds")
    if not seeds or TEST not in results["splits"]:
        return []
    lines = ["## Criterion 2 per seed", "",
             "| arm | seed | ratio 11-20 | ratio 41+ | effect size | one-sided p | verdict |",
             "|---|---|---|---|---|---|---|"]
    for name, arm in results["arms"].items():
        base = arm["spec"].get("baseline")
        if not base:
            continue
        rows = [*per_seed_trends(results, name, base).items(),
                ("pooled", results["splits"][TEST]["trends"][base][name])]
        for seed, t in rows:
            if "error" in t:
                lines.append(f"| {name} | {seed} | — | — | — | — | {t['error']} |")
                continue
            lines.append(f"| {name} | {seed} | {_fmt(t['ratio_short'])} | {_fmt(t['ratio_long'])} "
                         f"| {_fmt(effect_size(t))} | {t['p_value']:.3f} | "
                         f"**{'PASS' if trend_passes(t) else 'FAIL'}** |")
    lines += ["", "Effect size: the attention/none BLEU ratio on 41+ words divided by the "
              "ratio on 11-20 (about 2 in Bahdanau et al. 2015, Figure 2).", ""]
    return lines
