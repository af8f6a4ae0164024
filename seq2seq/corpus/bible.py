"""The embedded corpus: two SWORD Bibles read verse by verse and realigned book by book."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from seq2seq.corpus.align import (
    Bead,
    LengthModel,
    align_lengths,
    bead_cost,
    estimate_length_model,
    lexical_evidence,
)
from seq2seq.corpus.pair import Pair, format_ref
from seq2seq.corpus.sword import SwordLibrary, Verse, resolve_sword_path

log = logging.getLogger(__name__)

# Above this share of chapters where Strong's numbers and lengths prefer different
# verse offsets, a module's tags are taken not to follow its text (WEB's follow the
# Hebrew numbering: Ps 3:1 carries only the title's tags), and the tags are used only
# in the chapters where both signals agree. RV1909/KJV disagree in 6 of 1189.
MAX_DISAGREEMENT = 0.03
MIN_CHAPTER_DICE = 0.5  # mean Strong's overlap of a chapter's pairs that tags in sync reach
# Lengths contradict the tags only when they prefer another offset by this much (mean
# nats per verse); runs of similar verses (Lam 5) give lengths no clear preference.
MIN_LENGTH_MARGIN = 0.3


@dataclass
class BibleAlignment:
    """Realigned pairs of two modules and what happened on the way."""

    pairs: list[Pair]
    beads: Counter[str] = field(default_factory=Counter)  # "1-1", "2-1", ...
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> verses
    realigned: list[str] = field(default_factory=list)  # refs of pairs keys alone get wrong
    lexical: dict[str, object] = field(default_factory=dict)
    length_model: LengthModel | None = None


def _dice(a: frozenset[str], b: frozenset[str]) -> float | None:
    return 2 * len(a & b) / (len(a) + len(b)) if a and b else None


def _lemmas_agree(
    src: Sequence[Verse], tgt_by_key: dict[str, Verse], model: LengthModel
) -> bool | None:
    """Do Strong's numbers and lengths pick the same verse offset in this chapter?

    An offset o pairs source verse v with target verse v+o of the same chapter. The
    tags agree when the offset with the best mean lemma overlap has a high overlap
    (tags shifted by several verses, as WEB's in Exod 8, overlap poorly at every small
    offset) and its mean length cost is within ``MIN_LENGTH_MARGIN`` of the best
    offset's. None when the chapter is too short or untagged to tell.
    """
    lex, length = {}, {}
    for offset in (-1, 0, 1):
        dices, costs = [], []
        for verse in src:
            other = tgt_by_key.get(f"{verse.book}.{verse.chapter}.{verse.verse + offset}")
            if other is None or not other.text:
                continue
            costs.append(float(bead_cost(len(verse.text), len(other.text), model)))
            dice = _dice(verse.lemmas, other.lemmas)
            if dice is not None:
                dices.append(dice)
        if len(dices) < 3 or len(costs) < 3:
            return None
        lex[offset], length[offset] = np.mean(dices), np.mean(costs)
    best_lex = max(lex, key=lex.__getitem__)
    margin = length[best_lex] - min(length.values())
    return lex[best_lex] >= MIN_CHAPTER_DICE and margin <= MIN_LENGTH_MARGIN


def untrusted_chapters(
    src: dict[str, list[Verse]], tgt: dict[str, list[Verse]], model: LengthModel
) -> tuple[set[str], dict[str, object]]:
    """Chapters whose Strong's numbers must not be used, and a summary for the manifest."""
    disagree, checked = [], 0
    for book, verses in src.items():
        tgt_by_key = {v.key: v for v in tgt[book]}
        chapters: dict[str, list[Verse]] = {}
        for verse in verses:
            if verse.text:
                chapters.setdefault(verse.chapter_id, []).append(verse)
        for chapter_id, chapter in chapters.items():
            agree = _lemmas_agree(chapter, tgt_by_key, model)
            if agree is None:
                continue
            checked += 1
            if not agree:
                disagree.append(chapter_id)
    share = len(disagree) / max(checked, 1)
    untrusted = set(disagree) if share > MAX_DISAGREEMENT else set()
    summary = {
        "chapters_checked": checked,
        "chapters_lemmas_vs_lengths_disagree": len(disagree),
        "lemmas_ignored_in_chapters": sorted(untrusted),
    }
    return untrusted, summary


def _pair_from_bead(bead: Bead, src: Sequence[Verse], tgt: Sequence[Verse], pos: int) -> Pair:
    src_v = [src[i] for i in bead.src]
    tgt_v = [tgt[j] for j in bead.tgt]
    return Pair(
        src=" ".join(v.text for v in src_v),
        tgt=" ".join(v.text for v in tgt_v),
        ref=format_ref([v.key for v in src_v], [v.key for v in tgt_v]),
        group=src_v[0].chapter_id,
        pos=pos,
    )


def _align_book(
    src: list[Verse], tgt: list[Verse], model: LengthModel, untrusted: set[str]
) -> list[Bead]:
    def lemmas(verses: list[Verse]) -> list[frozenset[str]]:
        return [frozenset() if v.chapter_id in untrusted else v.lemmas for v in verses]

    lex = lexical_evidence(lemmas(src), lemmas(tgt))
    return align_lengths([len(v.text) for v in src], [len(v.text) for v in tgt], model, lex)


def read_bible(library: SwordLibrary, src_module: str, tgt_module: str) -> BibleAlignment:
    """Every book both modules hold, realigned; verses left unpaired are counted, not kept."""
    tgt_books = {book for book, _ in library.books(tgt_module)}
    src_books = [book for book, _ in library.books(src_module)]
    result = BibleAlignment(pairs=[])
    for book, lengths in library.books(tgt_module):
        if book not in src_books:
            result.dropped["target_book_not_in_source"] += sum(lengths)
    src: dict[str, list[Verse]] = {}
    tgt: dict[str, list[Verse]] = {}
    for book in src_books:
        if book not in tgt_books:
            result.dropped["source_book_not_in_target"] += len(library.verses(src_module, book))
            continue
        src[book] = library.verses(src_module, book)
        tgt[book] = library.verses(tgt_module, book)
    tgt_by_key = {v.key: v for verses in tgt.values() for v in verses}
    key_pairs = [
        (len(v.text), len(tgt_by_key[v.key].text))
        for verses in src.values()
        for v in verses
        if v.key in tgt_by_key
    ]
    model = estimate_length_model(key_pairs)
    untrusted, result.lexical = untrusted_chapters(src, tgt, model)
    result.length_model = model
    pos = 0
    for book in tqdm(src, desc="aligning", unit="book", disable=None):
        s = [v for v in src[book] if v.text]
        t = [v for v in tgt[book] if v.text]
        result.dropped["empty_source_verse"] += len(src[book]) - len(s)
        result.dropped["empty_target_verse"] += len(tgt[book]) - len(t)
        for bead in _align_book(s, t, model, untrusted):
            pos += 1
            result.beads[bead.kind] += 1
            if not bead.src or not bead.tgt:
                reason = "unpaired_source_verse" if bead.src else "unpaired_target_verse"
                result.dropped[reason] += len(bead.src) + len(bead.tgt)
                continue
            pair = _pair_from_bead(bead, s, t, pos)
            if "=" in pair.ref:  # keys differ, or a merged bead
                result.realigned.append(pair.ref)
            result.pairs.append(pair)
        log.debug("aligned %s: %d source, %d target verses", book, len(s), len(t))
    return result


def library(data_cfg: Any) -> SwordLibrary:
    return SwordLibrary(resolve_sword_path(data_cfg.sword_path))


def fingerprint(data_cfg: Any) -> dict[str, Any]:
    """Names and versions of the two modules: a new module version means a rebuild."""
    lib = library(data_cfg)
    return {
        "source": asdict(lib.info(data_cfg.src_module)),
        "target": asdict(lib.info(data_cfg.tgt_module)),
    }


def read_sword(data_cfg: Any) -> tuple[list[Pair], dict[str, Any]]:
    """Realigned pairs of the configured modules and the manifest's alignment section."""
    lib = library(data_cfg)
    result = read_bible(lib, data_cfg.src_module, data_cfg.tgt_module)
    model = result.length_model
    info = {
        "pairs": len(result.pairs),
        "pairs_realigned": len(result.realigned),
        "beads": dict(result.beads),
        "length_model": {"c": round(model.c, 4), "s2": round(model.s2, 4)} if model else None,
        "lemma_evidence": result.lexical,
        "realigned_refs": result.realigned,
    }
    return result.pairs, {"alignment": info, "dropped": dict(result.dropped)}
