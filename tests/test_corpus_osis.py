"""OSIS markup -> plain text, on markup copied from the Debian SWORD modules."""

import pytest

from seq2seq.corpus.osis import clean_osis, lemma_ids


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # removing a tag between two words must leave a space between them
        ("Jehová<transChange>es</transChange><w>para", "Jehová es para"),
        # RV1909 Zech 14:5 as stored: </w> then an added word
        ('<w lemma="strong:H3068">porque Jehová</w><transChange type="added">será</transChange>'
         '<w lemma="strong:H5973">con</w> vosotros.', "porque Jehová será con vosotros."),
        # an added enclitic stays glued to its verb (RV1909 Phil 3:13)
        ('de haber<transChange type="added">lo</transChange> <w lemma="strong:G2638">ya</w>',
         "de haberlo ya"),
        # KJV splits a few words across Strong's tags (Mark 4:24)
        ('<w lemma="strong:G4369">shall more be give</w>n.</q> ', "shall more be given."),
        # punctuation stays attached to its word
        ('<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H8064">los cielos</w>.',
         "EN el principio los cielos."),
        ('¿<w lemma="strong:H4100">qué</w> <w lemma="strong:H5414">me has de dar</w>?',
         "¿qué me has de dar?"),
    ],
)
def test_tags_removed_without_gluing_or_splitting(raw: str, expected: str) -> None:
    assert clean_osis(raw) == expected


def test_footnotes_dropped_with_their_text() -> None:
    # WEB Gen 1:1: the note sits between two words
    raw = (
        '<w lemma="strong:H0430">God</w><note placement="foot"><reference type="annotateRef">1:1 '
        '</reference>The Hebrew word rendered “God” is “אֱלֹהִ֑ים” (Elohim).</note>'
        '<w lemma="strong:H1254">created</w> <w>the</w> <w>earth</w>. '
    )
    assert clean_osis(raw) == "God created the earth."


def test_canonical_title_kept_other_headings_dropped() -> None:
    # KJV Ps 3:1: the superscription is canonical (RV1909 has it inline in verse 1)
    psalm = (
        '<title canonical="true" type="psalm">A <w>Psalm</w> of <w>David</w>.</title> '
        '<lg sID="gen2600"/> <l level="1" sID="gen2601"/><divineName><w>LORD</w></divineName>, '
        'how are they <w>increased</w>!'
    )
    assert clean_osis(psalm) == "A Psalm of David. LORD, how are they increased!"
    # KJV Ps 119:9: the acrostic heading is editorial
    acrostic = '<title><foreign>ב BETH.</foreign></title> <lg sID="g"/> Wherewithal shall a young man'
    assert clean_osis(acrostic) == "Wherewithal shall a young man"


def test_pilcrows_whitespace_and_speakers() -> None:
    raw = "¶ And  it came\n to pass<l/>that <speaker>Beloved</speaker>he <w>went</w> ."
    assert clean_osis(raw) == "And it came to pass that he went."


def test_line_break_tags_separate_words() -> None:
    # WEB: poetry lines meet without a space in the markup
    raw = 'soul,<l eID="a" level="1"/><l level="2" sID="b"/>“There is no help'
    assert clean_osis(raw) == "soul, “There is no help"


def test_text_after_the_book_end_is_dropped() -> None:
    # WEB Rev 22:21 carries the glossary after the book's end milestone
    raw = (
        'saints. Amen. <chapter eID="Rev.22"/> <div canonical="true" eID="gen1" osisID="Rev" '
        'type="book"/> <div sID="gen2" type="glossary"/> The following words ...'
    )
    assert clean_osis(raw) == "saints. Amen."


def test_lemma_ids_ignore_notes_and_normalise_numbers() -> None:
    raw = (
        '<w lemma="strong:H3068 H0430">Jehová Dios</w>'
        '<note><w lemma="strong:H9999">x</w></note> <w lemma="strong:G2424">Jesús</w>'
    )
    assert lemma_ids(raw) == frozenset({"H3068", "H430", "G2424"})
