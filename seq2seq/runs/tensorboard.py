"""TensorBoard event files of a training run: ``tensorboard --logdir runs``.

The run folder gets a ``tensorboard/`` folder (``train.tensorboard=true``, the default)
with the same numbers as ``metrics.csv`` and ``dev_buckets.csv``, and at every
validation the attention of a few fixed dev sentences (short, medium, long) as images,
so a person can watch the alignments form. The tags:

    train/loss, train/lr, train/tgt_tok_per_s, train/src_tok_per_s
    dev/loss, dev/ppl, dev/bleu
    dev_bleu_by_source_words/<bucket>, dev_chrf_by_source_words/<bucket>
    attention/<short|medium|long>       (models with attention only)

A resumed run purges the events logged after its checkpoint, so no step appears twice
(the same rule as metrics.csv). Under torchrun only rank 0 writes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

BOARD_DIR = "tensorboard"
# metrics.csv column -> TensorBoard tag
SCALARS = {"train_loss": "train/loss", "lr": "train/lr", "tgt_tok_per_s": "train/tgt_tok_per_s",
           "src_tok_per_s": "train/src_tok_per_s", "dev_loss": "dev/loss", "dev_ppl": "dev/ppl",
           "dev_bleu": "dev/bleu"}
# the fixed dev sentences shown as attention images: label -> source words aimed at
SAMPLE_WORDS = {"short": 8, "medium": 20, "long": 40}


@dataclass
class AttentionSample:
    """One dev sentence's greedy translation: weights (len(tgt), len(src)) and the subwords."""

    label: str
    weights: np.ndarray
    src_tokens: list[str]
    tgt_tokens: list[str]


class Board:
    """A ``SummaryWriter`` on ``<run_dir>/tensorboard``, or nothing when it is off or
    tensorboard is not installed (then one warning says how to get it)."""

    def __init__(self, run_dir: str | Path, resume_step: int | None, enabled: bool,
                 warn: Callable[[str], None] = log.warning) -> None:
        self.writer: Any = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warn("train.tensorboard=true but the tensorboard package is not installed: "
                        "no event files are written (pip install tensorboard, or set "
                        "train.tensorboard=false to silence this)")
            return
        # events at steps after the checkpoint belong to the lost part of a killed run
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / BOARD_DIR), purge_step=purge)

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    def scalars(self, row: dict[str, Any]) -> None:
        """One metrics.csv row; only the columns it has (train rows or dev rows)."""
        if not self.enabled:
            return
        for key, tag in SCALARS.items():
            value = row.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(tag, value, row["step"])

    def dev_buckets(self, step: int, rows: list[dict[str, Any]]) -> None:
        """One validation's BLEU and chrF per source-length bucket (and ``all``)."""
        if not self.enabled:
            return
        for metric in ("bleu", "chrf"):
            values = {r["bucket"]: r[metric] for r in rows
                      if isinstance(r.get(metric), int | float) and math.isfinite(r[metric])}
            for bucket, value in values.items():
                self.writer.add_scalar(f"dev_{metric}_by_source_words/{bucket}", value, step)

    def attention(self, step: int, samples: list[AttentionSample]) -> None:
        """Each sample as an image ``attention/<label>`` (target rows x source columns)."""
        if not self.enabled:
            return
        for sample in samples:
            self.writer.add_figure(f"attention/{sample.label}", attention_figure(sample), step)
        self.writer.flush()

    def close(self) -> None:
        if self.enabled:
            self.writer.close()


def attention_figure(sample: AttentionSample) -> Any:
    """A labelled matplotlib figure of one sample (closed by ``add_figure``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seq2seq.inference.heatmap import display_piece

    rows, cols = sample.weights.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.3 * cols, 20), min(1.5 + 0.25 * rows, 20)))
    ax.imshow(sample.weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(cols), [display_piece(t) for t in sample.src_tokens], rotation=90,
                  fontsize=7)
    ax.set_yticks(range(rows), [display_piece(t) for t in sample.tgt_tokens], fontsize=7)
    ax.xaxis.set_ticks_position("top")
    ax.set_title(f"{sample.label}: {cols} source x {rows} output subwords", fontsize=8)
    fig.tight_layout()
    return fig


def sample_indices(src_words: np.ndarray, valid_idx: np.ndarray) -> dict[str, int]:
    """The dev pair closest to each length of SAMPLE_WORDS (first in dev order on ties);
    the same pairs at every validation and on resume."""
    words = src_words[valid_idx]
    return {label: int(valid_idx[int(np.abs(words - target).argmin())])
            for label, target in SAMPLE_WORDS.items()} if len(valid_idx) else {}
