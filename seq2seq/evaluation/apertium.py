"""The rule-based reference row: Apertium (Debian ``apertium`` + ``apertium-eng-spa``).

All sentences go through one ``apertium -u <pair>`` call (``-u``: no ``*`` marks on
unknown words, which would only cost BLEU). Apertium's plain-text format keeps
line breaks, but it is a document translator: nothing promises one output line per
input line, and a count check alone misses a merge and a split that cancel out.
So every sentence is its own paragraph, preceded by a numbered marker paragraph
(``XQX17XQX``: an unknown upper-case token, which apertium copies unchanged). The
text between markers ``i`` and ``i+1`` is sentence ``i``'s translation whatever
apertium did to the paragraphs in between. A batch whose markers do not come back
as exactly ``0..n-1`` in order is split in halves and translated again, down to
single sentences.

Where apertium or the language pair is missing, :func:`translate` returns ``None``
and logs a note saying how to install it: the report then skips the row.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Sequence

log = logging.getLogger(__name__)

DEFAULT_PAIR = "spa-eng"
INSTALL_HINT = "install it with `apt-get install apertium apertium-eng-spa` (or `make system`)"
_SEPARATOR = "\n\n"  # a paragraph break: the strongest boundary of the text format
_MARK = "XQX{}XQX"
# A marker alone on its line; stray punctuation around it is tolerated.
_MARK_RE = re.compile(r"^[^\w\n]*XQX(\d+)XQX[^\w\n]*$", re.MULTILINE)


class _Unavailable(Exception):
    """apertium cannot run this pair here (missing pair, crash, timeout)."""


def _normalise(sentence: str) -> str:
    """One line per sentence: inner newlines and runs of blanks become one space."""
    return " ".join(sentence.split())


def _call(executable: str, pair: str, lines: Sequence[str], timeout_s: float) -> str:
    """One apertium process over ``lines``, each after its marker; returns its stdout."""
    text = "".join(f"{_MARK.format(i)}{_SEPARATOR}{line}{_SEPARATOR}"
                   for i, line in enumerate(lines))
    try:
        proc = subprocess.run(
            [executable, "-u", pair], input=text, capture_output=True, text=True,
            encoding="utf-8", timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise _Unavailable(f"apertium {pair} took longer than {timeout_s:.0f} s") from err
    except OSError as err:
        raise _Unavailable(f"apertium could not be started ({err})") from err
    # apertium prints some errors (e.g. an unknown pair) on stdout, so look at both.
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip() or "no message").splitlines()[0]
        raise _Unavailable(f"apertium {pair} failed with exit code {proc.returncode}: {message}")
    return proc.stdout


def _between_markers(output: str, n: int) -> list[str] | None:
    """The normalised text after each of the markers 0..n-1, or None unless exactly those
    markers come back, in order."""
    marks = list(_MARK_RE.finditer(output))
    if [int(m.group(1)) for m in marks] != list(range(n)):
        return None
    ends = [m.start() for m in marks[1:]] + [len(output)]
    return [_normalise(output[m.end():end]) for m, end in zip(marks, ends, strict=True)]


def _translate_aligned(
    executable: str, pair: str, lines: list[str], timeout_s: float
) -> tuple[list[str], int]:
    """Translations of ``lines`` (same count), and how many re-splits alignment needed."""
    output = _call(executable, pair, lines, timeout_s)
    parts = _between_markers(output, len(lines))
    if parts is not None:
        return parts, 0
    if len(lines) == 1:  # the marker itself was changed: everything else is the sentence
        return [_normalise(_MARK_RE.sub(" ", output))], 1
    half = len(lines) // 2
    left, n_left = _translate_aligned(executable, pair, lines[:half], timeout_s)
    right, n_right = _translate_aligned(executable, pair, lines[half:], timeout_s)
    return left + right, 1 + n_left + n_right


def translate(
    sentences: Sequence[str],
    pair: str = DEFAULT_PAIR,
    executable: str = "apertium",
    timeout_s: float = 3600.0,
) -> list[str] | None:
    """Translate ``sentences`` with Apertium; one output string per input, in order.

    Args:
        sentences: source sentences (inner line breaks are folded into spaces).
        pair: an Apertium mode such as ``spa-eng``.
        executable: the ``apertium`` script (a name on ``PATH`` or a path).
        timeout_s: limit for one apertium process.

    Returns:
        The translations, or ``None`` (with a logged note) where apertium or the pair
        is not installed or apertium fails. Empty sentences translate to ``""``.
    """
    found = shutil.which(executable)
    if found is None:
        log.warning("apertium is not installed, so the Apertium row is skipped: %s", INSTALL_HINT)
        return None
    lines = [_normalise(s) for s in sentences]
    todo = [i for i, line in enumerate(lines) if line]
    out = [""] * len(lines)
    if not todo:
        return out
    try:
        translated, resplits = _translate_aligned(found, pair, [lines[i] for i in todo], timeout_s)
    except _Unavailable as err:
        log.warning("%s; the Apertium row is skipped (%s)", err, INSTALL_HINT)
        return None
    if resplits:
        log.info("apertium merged or split paragraphs; %d batch re-split(s) realigned them",
                 resplits)
    for i, text in zip(todo, translated, strict=True):
        out[i] = text
    return out


def version(executable: str = "apertium", package: str = "apertium-eng-spa") -> str | None:
    """``apertium -V`` plus the Debian version of the language data (e.g. "Apertium 3.8.3,
    apertium-eng-spa 0.8.1-2"), or None where apertium is missing; for cache keys and reports."""
    found = shutil.which(executable)
    if found is None:
        return None
    parts = [_quiet([found, "-V"])]
    if shutil.which("dpkg-query"):
        data = _quiet(["dpkg-query", "-W", "-f", "${Version}", package])
        parts.append(f"{package} {data}" if data else "")
    return ", ".join(p for p in parts if p) or None


def _quiet(command: list[str]) -> str:
    """stdout of a short command, or "" if it fails."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""
