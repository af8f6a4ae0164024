"""Data-parallel training under ``torchrun``: process group, rank helpers, sharding, loss scale.

Launch (see the README, "Several processes / GPUs")::

    torchrun --nproc_per_node=N $(which seq2seq-train) train.distributed=true run_dir=runs/x ...

Every rank builds the same global batch order (the order is a pure function of
``(seed, epoch)``) and takes every ``world``-th pair of each global batch. Each rank's
loss is its summed cross-entropy divided by the GLOBAL batch's target tokens and
multiplied by ``world``, because DistributedDataParallel averages gradients: the
update then equals one process's update on the whole global batch, so
``train.batch_tokens`` is the effective batch whatever the number of processes.

Rank 0 alone writes the run folder (logs, metrics, checkpoints, summary) and
validates; the others receive its dev scores, so plateau schedules and early
stopping decide the same on every rank. Without ``train.distributed`` every helper
here is a no-op and training runs as one process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig
from tqdm import tqdm

from seq2seq.corpus import batching
from seq2seq.errors import ConfigError

T = TypeVar("T")
LAUNCH_HINT = "torchrun --nproc_per_node=N $(which seq2seq-train) train.distributed=true run_dir=..."


# ---------------------------------------------------------------- process group


def init(cfg: DictConfig, device: torch.device) -> torch.device:
    """Join torchrun's process group when ``train.distributed`` is set; returns this rank's device.

    CUDA ranks get ``cuda:LOCAL_RANK`` and the nccl backend, CPU ranks gloo. Every
    rank adopts rank 0's ``run_dir``, so a ``${now:...}`` default resolved a second
    apart on two ranks still names one folder.
    """
    world_env = os.environ.get("WORLD_SIZE")
    if not cfg.train.distributed:
        if world_env is not None and int(world_env) > 1:
            raise ConfigError(f"WORLD_SIZE={world_env}: this process was started by torchrun, but "
                              "train.distributed=false would make every process train alone into "
                              "the same run_dir; add train.distributed=true")
        return device
    if "RANK" not in os.environ or world_env is None:
        raise ConfigError("train.distributed=true needs the process group that torchrun sets up "
                          f"(RANK, WORLD_SIZE are unset): launch with `{LAUNCH_HINT}`, "
                          "or drop train.distributed for one process")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cfg.run_dir = on_main(lambda: str(cfg.run_dir))
    if not is_main():  # N copies of every info line would bury rank 0's; warnings still show
        logging.getLogger().setLevel(logging.WARNING)
    return device


def shutdown(wait: bool) -> None:
    """Leave the process group (a no-op outside one), after a barrier when ``wait``.

    Without the barrier a rank that finished first tears down gloo while rank 0 still
    talks to it, which aborts the process; a rank that failed must not wait, so that
    torchrun sees it exit and stops the others.
    """
    if dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """True on the rank that writes files and validates (always true without torchrun)."""
    return rank() == 0


@contextlib.contextmanager
def rank0_first() -> Iterator[None]:
    """Rank 0 runs the block first (it may train a tokenizer or write caches); the others
    run it afterwards and find that work done."""
    if not is_main():
        dist.barrier()
    yield
    if is_main() and dist.is_initialized():
        dist.barrier()


def on_main(fn: Callable[[], T]) -> T:
    """``fn()`` computed on rank 0 and sent to every rank (the others wait meanwhile)."""
    if not dist.is_initialized():
        return fn()
    box = [fn() if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _reduce(value: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(value, op=op)
    return value


def mean_over_ranks(loss: torch.Tensor) -> torch.Tensor:
    """The global batch's mean token loss from each rank's scaled share (a 0-dim tensor)."""
    if not dist.is_initialized():
        return loss
    return _reduce(loss.clone(), dist.ReduceOp.SUM) / world_size()


def _collective_device() -> torch.device:
    """Where a small tensor for a collective must live: nccl reduces on the GPU, gloo on CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def slowest(seconds: float) -> float:
    """The largest of every rank's clock, so a time budget stops all ranks at the same step."""
    if not dist.is_initialized():
        return seconds
    return float(_reduce(torch.tensor(seconds, dtype=torch.float64, device=_collective_device()),
                         dist.ReduceOp.MAX))


def gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` in one process)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is true on any rank (a signal that reached one process stops all
    of them at the same step; a collective, so every rank must call it at every step)."""
    if not dist.is_initialized():
        return flag
    return bool(_reduce(torch.tensor(int(flag), device=_collective_device()), dist.ReduceOp.MAX))


# ---------------------------------------------------------------- sharding and the loss scale


def shard(idx: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Rank ``rank``'s pairs of one global batch: every ``world``-th, starting at ``rank``.

    A global batch lists pairs of similar length next to each other, so striding
    gives the ranks about the same number of tokens.
    """
    return np.asarray(idx)[rank::world]


def local_batch(enc: batching.EncodedSplit, idx: np.ndarray) -> tuple[batching.Batch, float]:
    """This rank's share of the global batch ``idx`` and the factor its loss sum is scaled by.

    The returned Batch holds only this rank's rows, but its ``n_tgt_tokens`` and
    ``n_src_tokens`` count the whole global batch: the loss divides by the global
    target tokens, and throughput counts every rank's work. The scale is ``world``
    (undoing DDP's gradient average); a rank left without a pair (a global batch
    smaller than the world) runs one pair with scale 0, because DDP needs every rank
    in every backward pass.
    """
    world = world_size()
    if world == 1:
        return batching.collate(enc, idx), 1.0
    mine, scale = shard(idx, rank(), world), float(world)
    if len(mine) == 0:
        mine, scale = np.asarray(idx)[:1], 0.0
    batch = batching.collate(enc, mine)
    return replace(batch, n_src_tokens=int(enc.src_lens[idx].sum()),
                   n_tgt_tokens=int((enc.tgt_lens[idx] + 1).sum())), scale


def batch_record(batch_tokens: int) -> dict[str, Any]:
    """The effective batch as written to params.json and summary.json."""
    world = world_size()
    return {"world_size": world, "global_batch_tokens": batch_tokens,
            "rank_batch_tokens": round(batch_tokens / world)}


def prepare(run: Any) -> torch.nn.Module:
    """The module ``train_step`` calls: ``run.model`` wrapped in DDP under torchrun, else itself.

    ``run.model`` stays the bare model, which validation, decoding and checkpoints
    use. Records the effective batch in params.json and the log. Ranks other than 0
    reseed torch from ``(seed, rank, step)`` so their dropout masks differ from rank
    0's, unless a resume restored each rank's own RNG state from the checkpoint
    (``run.rank_rng_restored``; older checkpoints hold rank 0's only).
    """
    record = batch_record(run.cfg.train.batch_tokens)
    params = Path(run.log.dir) / "params.json"
    if is_main() and params.is_file():
        run.log.write_json("params.json", {**json.loads(params.read_text()), **record})
    run.log.info("effective batch: %d target tokens per step over %d process(es), ~%d each",
                 record["global_batch_tokens"], record["world_size"], record["rank_batch_tokens"])
    if not dist.is_initialized():
        return run.model
    if not is_main() and not run.rank_rng_restored:
        seed = np.random.SeedSequence([run.cfg.train.seed, rank(), run.progress.step])
        torch.manual_seed(int(seed.generate_state(1)[0]))
    device_ids = [run.device.index] if run.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(run.model, device_ids=device_ids)


# ---------------------------------------------------------------- ranks that write nothing


class SilentLog:
    """Stands in for :class:`~seq2seq.runs.log.RunLog` on ranks other than 0: writes nothing."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.console_logger = logging.getLogger()

    def info(self, msg: str, *args: Any) -> None:
        pass

    def warning(self, msg: str, *args: Any) -> None:
        pass

    def write_config(self, cfg: DictConfig) -> None:
        pass

    def write_json(self, name: str, obj: dict[str, Any]) -> None:
        pass

    def metrics(self, **row: Any) -> None:
        pass

    def dev_buckets(self, step: int, epoch: int, elapsed_s: float, rows: list[dict[str, Any]]) -> None:
        pass

    wants_attention = False

    def attention(self, step: int, samples: list[Any]) -> None:
        pass

    def progress(self, total: int | None, initial: int) -> tqdm:
        return tqdm(total=total, initial=initial, disable=True)

    def close(self) -> None:
        pass
