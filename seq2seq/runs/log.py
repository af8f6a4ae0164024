"""The run folder: resolved config, metrics CSV, log file, JSON records, progress bar.

Layout of ``run_dir`` (the training loop adds ``best.pt``, ``last.pt`` and ``tokenizer/``)::

    config.yaml    the resolved config of the run
    metrics.csv    one row per log interval and per validation
    dev_buckets.csv  per validation, dev BLEU/chrF/length ratio by source-length bucket
    train.log      everything the loop logged
    params.json    parameter counts
    summary.json   written when training ends
    tensorboard/   the same numbers and attention images as TensorBoard events (seq2seq.runs.tensorboard)
"""

from __future__ import annotations

import csv
import logging
import math
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from seq2seq import atomic
from seq2seq.contention import Meter
from seq2seq.runs.tensorboard import AttentionSample, Board

METRIC_FIELDS = (
    "step", "epoch", "train_loss", "lr", "tgt_tok_per_s", "src_tok_per_s",
    "dev_loss", "dev_ppl", "dev_bleu", "elapsed_s",
)
DEV_BUCKET_FIELDS = ("step", "epoch", "elapsed_s", "bucket", "count", "bleu", "chrf", "length_ratio")
DEV_BUCKETS = "dev_buckets.csv"
LOGGER_NAME = "seq2seq.training.loop"


class RunLog:
    """Writes the run folder's records; one instance per training run.

    On resume it keeps the existing files and drops metric rows logged after
    the checkpoint it resumes from, so the curve has no duplicate steps.
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None,
                 tensorboard: bool = False) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.csv"
        self.dev_buckets_path = self.dir / DEV_BUCKETS
        for path, fields in ((self.metrics_path, METRIC_FIELDS), (self.dev_buckets_path, DEV_BUCKET_FIELDS)):
            if resume_step is None or not path.exists():
                with path.open("w", newline="") as fh:
                    csv.DictWriter(fh, fields).writeheader()
            else:
                _truncate_csv(path, fields, resume_step)
        self.logger = logging.getLogger(LOGGER_NAME)
        self.logger.setLevel(logging.INFO)
        self._handlers: list[logging.Handler] = [logging.FileHandler(self.dir / "train.log")]
        self._handlers[0].setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
        )
        # Under Hydra the root logger prints to the console; elsewhere nobody does.
        self.console_logger = logging.getLogger()
        if not self.console_logger.handlers:
            self._handlers.append(logging.StreamHandler(sys.stderr))
            self.console_logger = self.logger
        for handler in self._handlers:
            self.logger.addHandler(handler)
        self.board = Board(self.dir, resume_step, tensorboard, self.warning)

    def info(self, msg: str, *args: Any) -> None:
        self.logger.info(msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self.logger.warning(msg, *args)

    def write_config(self, cfg: DictConfig) -> None:
        atomic.write_text(self.dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))

    def write_json(self, name: str, obj: dict[str, Any]) -> None:
        atomic.write_json(self.dir / name, obj, indent=2, sort_keys=True)

    def metrics(self, **row: Any) -> None:
        """Append one row to metrics.csv; missing fields stay empty, floats are rounded."""
        with self.metrics_path.open("a", newline="") as fh:
            csv.DictWriter(fh, METRIC_FIELDS).writerow(_rounded(row))
        self.board.scalars(row)

    def dev_buckets(self, step: int, epoch: int, elapsed_s: float, rows: list[dict[str, Any]]) -> None:
        """Append one validation's rows (bucket, count, bleu, chrf, length_ratio) to dev_buckets.csv."""
        with self.dev_buckets_path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, DEV_BUCKET_FIELDS)
            for row in rows:
                writer.writerow(_rounded({"step": step, "epoch": epoch, "elapsed_s": elapsed_s, **row}))
        self.board.dev_buckets(step, rows)

    @property
    def wants_attention(self) -> bool:
        """Whether :meth:`attention` shows anything (TensorBoard is on and installed)."""
        return self.board.enabled

    def attention(self, step: int, samples: list[AttentionSample]) -> None:
        """Attention images of the fixed dev sentences (seq2seq.training.validation.attention_samples)."""
        self.board.attention(step, samples)

    def progress(self, total: int | None, initial: int) -> tqdm:
        """A step progress bar (stderr, hidden when it is not a terminal)."""
        # tqdm's own ETA ignores max_minutes; the loop puts the real one in the postfix
        return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                    disable=None, file=sys.stderr, leave=True,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]")

    def close(self) -> None:
        self.board.close()
        for handler in self._handlers:
            self.logger.removeHandler(handler)
            handler.close()


class Window:
    """Training loss, tokens and step time summed since the last log line.

    The loss stays a device tensor so logging does not force a sync every step.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss: Any = 0.0
        self.steps = self.tgt_tokens = self.src_tokens = 0
        self.seconds = self.cpu_seconds = 0.0

    def add(self, loss: Any, tgt_tokens: int, src_tokens: int, seconds: float,
            cpu_seconds: float = 0.0) -> None:
        self.loss = self.loss + loss
        self.steps += 1
        self.tgt_tokens += tgt_tokens
        self.src_tokens += src_tokens
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds

    def cores(self) -> Meter:
        """The steps' CPU and wall seconds, to tell whether they ran on busy cores."""
        return Meter(cpu=self.cpu_seconds, wall=self.seconds)

    def mean_loss(self) -> float:
        return float(self.loss) / max(self.steps, 1)

    def tgt_per_s(self) -> float:
        return self.tgt_tokens / max(self.seconds, 1e-9)

    def src_per_s(self) -> float:
        return self.src_tokens / max(self.seconds, 1e-9)


def format_duration(seconds: float) -> str:
    """``H:MM:SS``; ``?`` when unknown."""
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(max(seconds, 0)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _round(x: float) -> float | str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return float(f"{x:.6g}")


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (_round(v) if isinstance(v, float) else v) for k, v in row.items()}


def _truncate_csv(path: Path, fields: tuple[str, ...], step: int) -> None:
    """Drop the rows logged after ``step`` (a resumed run logs them again)."""
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("step") and int(r["step"]) <= step]
    with atomic.atomic_open(path) as fh:  # a kill here must not lose the rows kept
        writer = csv.DictWriter(fh, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_dev_buckets(run_dir: str | Path) -> list[dict[str, str]]:
    """The rows of a run's dev_buckets.csv; [] for a run without one (older runs, BLEU off)."""
    path = Path(run_dir) / DEV_BUCKETS
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def read_metrics(run_dir: str | Path) -> list[dict[str, str]]:
    """The rows of a run's metrics.csv (strings; empty where a row had no value)."""
    with (Path(run_dir) / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))
