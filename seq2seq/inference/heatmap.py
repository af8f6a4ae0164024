"""Attention heatmaps: Unicode shades for the terminal and a matplotlib PNG.

Both take one attention matrix ``(tgt_len, src_len)``: target subwords as rows,
source subwords as columns, each row the weights of one output step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seq2seq.errors import Seq2SeqError

SHADES = " ░▒▓█"
CELL = 2  # characters per column: square-looking cells, room for a two-digit index
ROW_LABEL = 12  # longest target subword shown in full; longer ones end in "…"
HEADER = 8  # the vertical source labels show this many characters


def shade(weight: float) -> str:
    """The block character for one weight in [0, 1].

    A square-root scale, so the long tail of small weights stays visible:
    ░ from 0.016, ▒ from 0.14, ▓ from 0.39, █ from 0.77.
    """
    level = round(math.sqrt(min(max(weight, 0.0), 1.0)) * (len(SHADES) - 1))
    return SHADES[level]


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _check(attention: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str]) -> None:
    if attention.shape != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(f"attention {attention.shape} does not match "
                         f"{len(tgt_tokens)} target x {len(src_tokens)} source tokens")


def display_piece(piece: str) -> str:
    """A subword as the heatmap shows it: SentencePiece's word-start mark "▁" dropped,
    a piece inside a word marked "·", so word boundaries stay visible in little room."""
    return piece[1:] or "▁" if piece.startswith("▁") else "·" + piece


def _header(src_tokens: Sequence[str], start: int, indent: int) -> list[str]:
    """Source subwords written top to bottom above their columns, then every fifth
    column index (global, counted from 0)."""
    pieces = [_fit(display_piece(t), HEADER) for t in src_tokens]
    height = max(len(p) for p in pieces)
    lines = []
    for row in range(height):
        cells = "".join(p[row].ljust(CELL) if row < len(p) else " " * CELL for p in pieces)
        lines.append(" " * indent + cells)
    ticks = [" "] * (len(pieces) * CELL + 3)
    for i in range(len(pieces)):
        if (start + i) % 5 == 0:
            label = str(start + i)
            ticks[i * CELL:i * CELL + len(label)] = label
    lines.append(" " * indent + "".join(ticks).rstrip())
    return lines


def _block(attention: np.ndarray, src_tokens: Sequence[str], tgt_labels: list[str],
           start: int, notes: list[str]) -> list[str]:
    """One band of columns ``start:start + len(src_tokens)`` (global indices), each row
    followed by its entry of ``notes`` (empty strings for all but the last band)."""
    label_width = max(len(label) for label in tgt_labels)
    lines = _header(src_tokens, start, label_width + 2)  # under the cells, past " │"
    band = attention[:, start:start + len(src_tokens)]
    for label, row, note in zip(tgt_labels, band, notes, strict=True):
        cells = "".join(shade(float(w)) * CELL for w in row)
        lines.append(f"{label.rjust(label_width)} │{cells}│{note}")
    return lines


def _argmax_notes(attention: np.ndarray, src_tokens: Sequence[str]) -> list[str]:
    """Per row: the most attended source subword and its weight (blank if all zero)."""
    notes = []
    for row in attention:
        j = int(row.argmax())
        notes.append(f" {_fit(display_piece(src_tokens[j]), HEADER)} {row[j]:.2f}"
                     if row[j] > 0 else "")
    return notes


def render_heatmap(attention: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                   width: int = 100) -> str:
    """A text heatmap of ``attention`` (tgt_len, src_len) that fits in ``width`` columns.

    Rows are target subwords, columns source subwords (labels printed
    vertically, every fifth column numbered). Each row ends with its most
    attended source subword and that weight. A matrix wider than ``width`` is
    wrapped into bands of equal width, each repeating the row labels.
    """
    attention = np.asarray(attention, dtype=np.float32)
    _check(attention, src_tokens, tgt_tokens)
    if attention.size == 0:
        return "(no attention to show: empty source or output)"
    labels = [_fit(display_piece(t), ROW_LABEL) for t in tgt_tokens]
    label_width = max(len(label) for label in labels)
    fits = max(1, (width - label_width - 3 - (HEADER + 6)) // CELL)
    bands = math.ceil(len(src_tokens) / fits)
    per_band = math.ceil(len(src_tokens) / bands)
    notes = _argmax_notes(attention, src_tokens)
    lines: list[str] = []
    for start in range(0, len(src_tokens), per_band):
        last = start + per_band >= len(src_tokens)
        if lines:
            lines.append("")
        lines += _block(attention, src_tokens[start:start + per_band], labels, start,
                        notes if last else [""] * len(labels))
    legend = "  ".join(f"{SHADES[k]} ≥{((k - 0.5) / (len(SHADES) - 1)) ** 2:.2f}"
                       for k in range(1, len(SHADES)))
    if not attention.any():
        legend += "  (all weights are zero: this model has no attention, model.attention.name=none)"
    return "\n".join([*lines, legend])


def save_heatmap(attention: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                 path: str | Path) -> Path:
    """Write ``attention`` (tgt_len, src_len) as a labelled image (PNG, or any format
    matplotlib infers from the suffix). Seq2SeqError if the file cannot be written."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and no GUI toolkit import
    import matplotlib.pyplot as plt

    attention = np.asarray(attention, dtype=np.float32)
    _check(attention, src_tokens, tgt_tokens)
    path = Path(path).expanduser()
    rows, cols = attention.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * cols, 40), min(1.5 + 0.3 * rows, 40)))
    try:
        image = ax.imshow(attention, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(cols), [display_piece(t) for t in src_tokens], rotation=90)
        ax.set_yticks(range(rows), [display_piece(t) for t in tgt_tokens])
        ax.set_xlabel("source")
        ax.set_ylabel("output")
        ax.xaxis.set_ticks_position("top")
        ax.xaxis.set_label_position("top")
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as err:
        raise Seq2SeqError(f"cannot write {path} ({err}): pick a writable path ending in .png") from err
    finally:
        plt.close(fig)
    return path
