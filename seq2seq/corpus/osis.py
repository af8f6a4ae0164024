"""OSIS markup of one SWORD verse -> plain text.

What the Debian modules contain (measured on spaRV1909eb, engKJV2006eb, engWEB2015eb):
Strong's ``<w>`` wrappers, ``<transChange>`` (words the translators added), footnotes and
cross references in ``<note>``, Psalm superscriptions in ``<title canonical="true">``,
acrostic headings (Psalm 119) in non-canonical ``<title>``, speaker labels (Song of
Songs), poetry and paragraph milestones, pilcrows, and in WEB a glossary appended to
Rev 22:21 after the book-end milestone.

Removing a tag must neither glue two words (``Jehová</w><transChange>es`` -> "Jehová
es") nor split one: the KJV splits a few words across Strong's tags (``give</w>n``)
and RV1909 marks added enclitics (``haber<transChange>lo</transChange>``).
"""

from __future__ import annotations

import re

# Elements dropped together with their content.
_DROP_ELEMENTS = re.compile(
    r"<(note|speaker|catchWord|rdg)\b[^>]*?(?<!/)>.*?</\1>", re.DOTALL
)
_TITLE = re.compile(r"<title\b([^>]*?)(?<!/)>(.*?)</title>", re.DOTALL)
# The end of the book: anything after it (WEB's glossary) is not Bible text.
_BOOK_END = re.compile(r'<div\b(?=[^>]*\beID=)(?=[^>]*\btype="book")[^>]*>')
_TAG_RUN = re.compile(r"(?:<[^>]*>)+")
_TAG_NAME = re.compile(r"</?\s*([A-Za-z]+)")
# Tags that only wrap words; every other tag (div, l, lg, lb, p, chapter, title, list,
# item, milestone, ...) marks a line or paragraph boundary and separates words.
_INLINE_TAGS = frozenset({"w", "transChange", "divineName", "seg", "foreign", "q", "hi", "name"})
# Spanish object pronouns that RV1909 adds as enclitics (``preguntándo<transChange>le``).
_ENCLITICS = frozenset({"lo", "la", "le", "los", "las", "les", "me", "te", "se", "nos", "os"})
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)\]])")
_SPACES = re.compile(r"\s+")
_LEMMA = re.compile(r'lemma="([^"]*)"')
_STRONG = re.compile(r"(?:strong:)?([HG])0*(\d+)")
_BOUNDARY = "\x00"  # stands for a removed note/heading until spacing is decided


def _keep_title(match: re.Match[str]) -> str:
    # Canonical titles (Psalm superscriptions) are part of the verse: RV1909 has them
    # inline in verse 1. Other titles are editorial headings.
    if 'canonical="true"' in match.group(1):
        return f"{_BOUNDARY}{match.group(2)}{_BOUNDARY}"
    return _BOUNDARY


def _is_word_char(ch: str) -> bool:
    return ch.isalnum()


def _join(left: str, tags: str, right: str, rest: str) -> str:
    """What replaces a run of tags between the characters ``left`` and ``right``."""
    names = _TAG_NAME.findall(tags)
    if not (_is_word_char(left) and _is_word_char(right)):
        # Next to punctuation or space: a block tag still separates ("soul,<l/>Many").
        block = any(n not in _INLINE_TAGS for n in names) or _BOUNDARY in tags
        opening_punct = left in "(¿¡“‘«[—" or left == ""
        closing_punct = right in ",.;:!?)]”’»" or right == ""
        return " " if block and not opening_punct and not closing_punct else ""
    if _BOUNDARY in tags or any(n not in _INLINE_TAGS for n in names):
        return " "
    if "transChange" in names:
        added = re.match(r"\w+", rest)
        glued_enclitic = tags.startswith("<transChange") and added and added.group(0) in _ENCLITICS
        return "" if glued_enclitic else " "
    return ""  # a word split across Strong's tags: "give</w>n"


def clean_osis(raw: str) -> str:
    """Plain text of one verse of OSIS markup.

    Drops notes, non-canonical titles, speaker labels and pilcrows; keeps canonical
    titles' text; removes tags without gluing or splitting words; normalises whitespace;
    punctuation stays attached to its word.
    """
    end = _BOOK_END.search(raw)
    text = raw[: end.start()] if end else raw
    text = _DROP_ELEMENTS.sub(_BOUNDARY, text)
    text = _TITLE.sub(_keep_title, text)
    text = text.replace("¶", " ")
    # A boundary marker is treated like a tag so the spacing rules see it.
    text = text.replace(_BOUNDARY, f"<{_BOUNDARY}/>")
    out: list[str] = []
    pos = 0
    for match in _TAG_RUN.finditer(text):
        out.append(text[pos : match.start()])
        left = text[match.start() - 1] if match.start() > 0 else ""
        rest = text[match.end() :]
        right = rest[:1]
        out.append(_join(left, match.group(0), right, rest))
        pos = match.end()
    out.append(text[pos:])
    plain = "".join(out)
    plain = _unescape(plain)
    plain = _SPACES.sub(" ", plain).strip()
    return _SPACE_BEFORE_PUNCT.sub(r"\1", plain)


def _unescape(text: str) -> str:
    return (
        text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
        .replace("&apos;", "'").replace("&amp;", "&")
    )


def lemma_ids(raw: str) -> frozenset[str]:
    """Strong's numbers ("H3068", "G2424") tagged on the verse's words, notes excluded.

    They name the Hebrew/Greek word each word translates, the same in every language,
    which makes them evidence for the aligner (seq2seq.corpus.align).
    """
    end = _BOOK_END.search(raw)
    text = _DROP_ELEMENTS.sub(" ", raw[: end.start()] if end else raw)
    ids = set()
    for lemma in _LEMMA.findall(text):
        for token in lemma.split():
            match = _STRONG.fullmatch(token.rstrip("abcdefghijklmnopqrstuvwxyz"))
            if match:
                ids.add(match.group(1) + match.group(2))
    return frozenset(ids)
