"""The unit every corpus kind produces: one aligned segment pair and where it came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    """One source/target segment pair.

    ``ref`` names the verse(s) or line(s) ("Num.13.1", "Gen.1.1-Gen.1.2", or
    "Num.13.33=Num.13.32-Num.13.33" when the target side's keys differ); ``group`` is
    the unit of splitting (a chapter, a block of lines), so no group spans two splits;
    ``pos`` orders pairs in the text: consecutive segments have consecutive ``pos``.
    """

    src: str
    tgt: str
    ref: str
    group: str
    pos: int

    @property
    def src_words(self) -> int:
        return len(self.src.split())

    @property
    def tgt_words(self) -> int:
        return len(self.tgt.split())


def key_range(keys: Sequence[str]) -> str:
    """"Gen.1.1" for one key, "Gen.1.1-Gen.1.3" for several consecutive ones."""
    return keys[0] if len(keys) == 1 else f"{keys[0]}-{keys[-1]}"


def format_ref(src_keys: Sequence[str], tgt_keys: Sequence[str]) -> str:
    """The source keys, plus "=<target keys>" when the two sides are numbered differently."""
    src, tgt = key_range(src_keys), key_range(tgt_keys)
    return src if src == tgt else f"{src}={tgt}"


def ref_bounds(ref: str) -> tuple[str, str]:
    """First and last source key of a ref (the part before "=")."""
    src = ref.split("=", 1)[0]
    first, _, last = src.partition("-")
    return first, last or first
