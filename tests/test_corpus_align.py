"""Realignment: the length-based dynamic program and the Bible reader around it."""

import random

import pytest

from seq2seq.corpus.align import LengthModel, align_lengths, estimate_length_model
from seq2seq.corpus.bible import read_bible
from seq2seq.corpus.sword import Verse

MODEL = LengthModel(c=1.0, s2=1.3)


def _kinds(beads):
    return [(b.src, b.tgt) for b in beads]


def test_equal_lengths_pair_one_to_one() -> None:
    lengths = [40, 120, 75, 60, 200, 33]
    beads = align_lengths(lengths, lengths, MODEL)
    assert _kinds(beads) == [((i,), (i,)) for i in range(len(lengths))]


def test_a_verse_split_in_two_becomes_a_merged_bead() -> None:
    beads = align_lengths([50, 100, 30, 32, 80], [50, 100, 62, 80], MODEL)
    assert _kinds(beads) == [((0,), (0,)), ((1,), (1,)), ((2, 3), (2,)), ((4,), (3,))]


def test_an_omitted_verse_is_left_unpaired() -> None:
    beads = align_lengths([50, 100, 70, 80], [50, 100, 80], MODEL)
    assert _kinds(beads) == [((0,), (0,)), ((1,), (1,)), ((2,), ()), ((3,), (2,))]


def test_length_model_fits_the_ratio() -> None:
    model = estimate_length_model([(100, 110), (50, 55), (200, 220), (0, 30)])
    assert model.c == pytest.approx(1.1)


class FakeLibrary:
    """Stands in for SwordLibrary: modules given as {name: {book: [Verse]}}."""

    def __init__(self, modules: dict[str, dict[str, list[Verse]]]) -> None:
        self.modules = modules

    def books(self, name):
        return [(b, []) for b in self.modules[name]]

    def verses(self, name, book):
        return self.modules[name][book]


def _text(rng: random.Random, n_words: int, lang: str) -> str:
    return " ".join(f"{lang}{rng.randrange(500)}" for _ in range(n_words))


def _shifted_book(with_lemmas: bool) -> FakeLibrary:
    """Num 12-13 as in the modules: the source's 12:16 is empty and its text opens 13.

    The target has 12:1-16 and 13:1-33; the source has 12:1-15, an empty 12:16, and
    13:1-33 where 13:1 translates target 12:16, 13:k target 13:k-1, and 13:33 holds
    target 13:32-33.
    """
    rng = random.Random(7)
    content = [(12, v) for v in range(1, 17)] + [(13, v) for v in range(1, 34)]
    words = {c: rng.randrange(6, 45) for c in content}
    lemmas = {c: frozenset(f"H{rng.randrange(9000)}" for _ in range(words[c] // 2)) for c in content}

    def lem(*cs):
        return frozenset().union(*(lemmas[c] for c in cs)) if with_lemmas else frozenset()

    tgt = [Verse("Num", c, v, _text(rng, words[(c, v)], "en"), lem((c, v))) for c, v in content]
    src = [Verse("Num", 12, v, _text(rng, words[(12, v)], "es"), lem((12, v))) for v in range(1, 16)]
    src.append(Verse("Num", 12, 16, ""))
    src.append(Verse("Num", 13, 1, _text(rng, words[(12, 16)], "es"), lem((12, 16))))
    for v in range(2, 33):
        src.append(Verse("Num", 13, v, _text(rng, words[(13, v - 1)], "es"), lem((13, v - 1))))
    merged = words[(13, 32)] + words[(13, 33)]
    src.append(Verse("Num", 13, 33, _text(rng, merged, "es"), lem((13, 32), (13, 33))))
    return FakeLibrary({"es": {"Num": src}, "en": {"Num": tgt}})


@pytest.mark.parametrize("with_lemmas", [True, False])
def test_a_shift_across_a_chapter_boundary_is_realigned(with_lemmas: bool) -> None:
    result = read_bible(_shifted_book(with_lemmas), "es", "en")
    refs = [p.ref for p in result.pairs]
    assert refs[:15] == [f"Num.12.{v}" for v in range(1, 16)]  # unshifted part untouched
    assert "Num.13.1=Num.12.16" in refs
    assert all(f"Num.13.{v}=Num.13.{v - 1}" in refs for v in range(2, 33))
    assert refs[-1] == "Num.13.33=Num.13.32-Num.13.33"  # merged bead names both verses
    assert len(result.realigned) == 33
    assert result.dropped["empty_source_verse"] == 1
    # the pair keeps the verse's chapter as its split group
    assert {p.group for p in result.pairs} == {"Num.12", "Num.13"}


def test_tags_that_lag_their_text_are_not_trusted() -> None:
    """WEB's Strong's numbers follow another numbering; keys are right, tags one verse off."""
    rng = random.Random(3)
    src, tgt = [], []
    for chapter in range(1, 5):
        n = 20
        words = [rng.randrange(6, 45) for _ in range(n)]
        ids = [frozenset(f"H{rng.randrange(9000)}" for _ in range(8)) for _ in range(n)]
        for v in range(1, n + 1):
            src.append(Verse("Ps", chapter, v, _text(rng, words[v - 1], "es"), ids[v - 1]))
            # chapter 2's target tags are those of the verse before (text in sync)
            tag = ids[v - 2] if chapter == 2 and v > 1 else ids[v - 1]
            tgt.append(Verse("Ps", chapter, v, _text(rng, words[v - 1], "en"), tag))
    result = read_bible(FakeLibrary({"es": {"Ps": src}, "en": {"Ps": tgt}}), "es", "en")
    assert result.lexical["lemmas_ignored_in_chapters"] == ["Ps.2"]
    assert result.realigned == []
