"""Read Bible verses from installed SWORD modules with pysword."""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seq2seq.corpus.osis import clean_osis, lemma_ids
from seq2seq.errors import DataError

log = logging.getLogger(__name__)

DEFAULT_SWORD_PATH = "/usr/share/sword"
INSTALL_HINT = (
    "run `make install` (Debian packages sword-text-sparv, sword-text-kjv, sword-text-web) "
    "or set SWORD_PATH / data.sword_path to a folder holding mods.d/ and modules/"
)
_EPISTLES = frozenset(
    {"Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess", "2Thess", "1Tim", "2Tim"}
    | {"Titus", "Phlm", "Heb"}
)
_AMEN = re.compile(r".*\bAm[eé]n\.", re.DOTALL)  # greedy: the last Amen of the verse


@dataclass(frozen=True)
class Verse:
    """One verse slot of a module's versification; ``text`` is cleaned ('' when empty)."""

    book: str  # OSIS book id, e.g. "Num"
    chapter: int
    verse: int
    text: str
    lemmas: frozenset[str] = frozenset()  # Strong's numbers of its words

    @property
    def key(self) -> str:
        return f"{self.book}.{self.chapter}.{self.verse}"

    @property
    def chapter_id(self) -> str:
        return f"{self.book}.{self.chapter}"


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    version: str
    versification: str
    language: str


def resolve_sword_path(configured: str | None) -> Path:
    """``data.sword_path``, else ``$SWORD_PATH``, else the Debian location."""
    return Path(configured or os.environ.get("SWORD_PATH") or DEFAULT_SWORD_PATH)


class SwordLibrary:
    """The modules installed under one SWORD data path."""

    def __init__(self, path: Path) -> None:
        from pysword.modules import SwordModules

        if not (path / "mods.d").is_dir():
            raise DataError(f"no SWORD modules at {path} (mods.d/ missing): {INSTALL_HINT}")
        self.path = path
        self._modules = SwordModules(str(path))
        self._confs: dict[str, dict[str, Any]] = self._modules.parse_modules()
        self._bibles: dict[str, Any] = {}

    def info(self, name: str) -> ModuleInfo:
        conf = self._conf(name)
        return ModuleInfo(
            name=name,
            version=conf.get("version", "unknown"),
            versification=conf.get("versification", "KJV"),
            language=conf.get("lang", ""),
        )

    def _conf(self, name: str) -> dict[str, Any]:
        if name not in self._confs:
            found = ", ".join(sorted(self._confs)) or "none"
            raise DataError(
                f"SWORD module {name} not found in {self.path} (installed: {found}): {INSTALL_HINT}"
            )
        return self._confs[name]

    def books(self, name: str) -> list[tuple[str, list[int]]]:
        """(OSIS book id, verses per chapter) in canonical order."""
        structure = self._bible(name).get_structure()
        return [
            (book.osis_name, list(book.chapter_lengths))
            for testament in ("ot", "nt")
            for book in structure.get_books().get(testament, [])
        ]

    def verses(self, name: str, book: str) -> list[Verse]:
        """Every verse slot of ``book`` in order, text cleaned of OSIS markup."""
        bible = self._bible(name)
        lengths = dict(self.books(name))[book]
        raw = bible.get_iter(books=[book], clean=False)
        verses = []
        for chapter, n_verses in enumerate(lengths, start=1):
            for verse in range(1, n_verses + 1):
                markup = next(raw, "") or ""
                verses.append(Verse(book, chapter, verse, clean_osis(markup), lemma_ids(markup)))
        return drop_subscription(verses)

    def _bible(self, name: str) -> Any:
        if name in self._bibles:
            return self._bibles[name]
        self._conf(name)
        try:
            bible = self._modules.get_bible_from_module(name)
        except (OSError, ValueError, KeyError, NotImplementedError) as err:
            raise DataError(
                f"SWORD module {name} in {self.path} is unreadable ({err}): {INSTALL_HINT}"
            ) from err
        # pysword decompresses the whole book block for every verse it returns, so reading
        # a module verse by verse is slow; caching the last blocks decompresses each block
        # once (docs/performance.md#corpus-build).
        bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
        self._bibles[name] = bible
        return bible


def drop_subscription(verses: list[Verse]) -> list[Verse]:
    """Cut an epistle's subscription ("Escrita de Roma ...") off its last verse.

    RV1909 prints these editorial colophons, unmarked, after the closing "Amén." of
    Romans to Hebrews; the English modules leave them out, so kept they would be
    untranslated text (and they misled the aligner at the end of 2 Timothy and Titus).
    """
    if not verses or verses[0].book not in _EPISTLES:
        return verses
    filled = [i for i, v in enumerate(verses) if v.text]
    if not filled:
        return verses
    last = filled[-1]
    match = _AMEN.search(verses[last].text)
    if match is None or match.end() == len(verses[last].text):
        return verses
    cut = verses[last].text[: match.end()]
    return [*verses[:last], replace(verses[last], text=cut), *verses[last + 1 :]]
