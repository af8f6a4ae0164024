"""The training loop, read top to bottom: step, validate, checkpoint, run.

``train_main(cfg)`` first sets the run up (:mod:`seq2seq.training.setup`: corpus, tokenizers,
model, a resumed checkpoint), so a bad config or a missing corpus fails in the first
second. The loop state that a resumed run needs (step, epoch, batch index inside the
epoch, best score, patience, time used) lives in :class:`~seq2seq.training.setup.Progress`
and goes into every checkpoint with the model, optimizer, scheduler and RNG states.
A signal (SIGTERM, SIGINT, SIGUSR1) stops the loop at the next step boundary with a
checkpoint (:mod:`seq2seq.training.preempt`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from seq2seq import contention, native, precision
from seq2seq.corpus import batching
from seq2seq.errors import Seq2SeqError
from seq2seq.model import gemm
from seq2seq.model.loss import chunk_shapes
from seq2seq.runs.checkpoint import (
    BEST,
    LAST,
    atomic_save,
    capture_rng_state,
    keep_checkpoint,
    make_checkpoint,
)
from seq2seq.runs.log import Window, format_duration
from seq2seq.training import distributed, preempt, validation
from seq2seq.training.setup import Progress, Run, setup

# ---------------------------------------------------------------- step and validation


def choose_precision(run: Run) -> None:
    """Resolve ``train.precision`` once (``auto`` times real passes, rank 0 decides for
    all); a resumed run keeps the precision it started with."""
    p = run.progress
    if p.precision:
        kept = precision.of_name(p.precision)
        run.bf16, run.loss_bf16, run.gemm_bf16 = kept.bf16, kept.loss_bf16, kept.gemm_bf16
        run.log.info("precision: %s (kept from the run's start)", p.precision)
        return
    batches = [validation.to_device(batching.collate(run.data.train, idx), run.device)
               for idx in epoch_batches(run)[:precision.PROBE_BATCHES]]
    choice = distributed.on_main(lambda: resolve_precision(run, batches))
    run.bf16, run.loss_bf16, run.gemm_bf16 = choice.bf16, choice.loss_bf16, choice.gemm_bf16
    p.precision = choice.name
    run.log.info("precision: %s", choice.reason)


def resolve_precision(run: Run, batches: list[batching.Batch]) -> precision.Choice:
    """``train.precision`` on ``run``'s device; ``auto`` times training passes of the first
    PROBE_BATCHES of ``batches`` (seq2seq.precision.probe), nothing else changes."""
    probed = batches[:precision.PROBE_BATCHES]
    return precision.choose(run.cfg.train.precision, run.device,
                            [training_pass(run, b) for b in probed],
                            sizes=[b.n_tgt_tokens for b in probed])


def choose_gemm(run: Run) -> gemm.Choice:
    """The route of the fp32 GEMMs (MKL, oneDNN or its grid, :mod:`seq2seq.model.gemm`),
    measured at the run's start. The routes round differently, and a new timing may pick
    another on a near tie, so a resumed run on a CPU keeps its start's route, and with
    fixed paths (``train.deterministic``, :func:`seq2seq.native.fixed`) none is timed."""
    kept = run.progress.fp32_gemm
    if kept and run.device.type == "cpu" and (kept == "default" or gemm.available()):
        choice = gemm.named(kept, f"{kept} (kept from the run's start)")
    else:
        shapes, step = chunk_shapes(run.model), gemm.step_probe(run.model)
        choice = distributed.on_main(lambda: gemm.choose(run.device, shapes, step,
                                                         fixed=native.fixed()))
    run.progress.fp32_gemm = choice.name
    run.log.info("fp32 GEMMs: %s", choice.reason)
    return choice


def bf16_route(run: Run, route: gemm.Choice) -> gemm.Choice:
    """``route`` as training in bf16 needs it (:func:`seq2seq.model.gemm.for_bf16`: no
    fp32 grid; bf16 products as they are unless SEQ2SEQ_BF16_GEMM=grid); ``route`` itself
    in fp32."""
    if not run.bf16:
        return route
    route = gemm.for_bf16(route, run.device)
    run.progress.fp32_gemm, run.progress.bf16_gemm = route.name, route.bf16_name
    run.log.info("bf16 GEMMs: %s", route.bf16_reason)
    return route


def training_pass(run: Run, batch: batching.Batch) -> Callable[[], None]:
    """One forward+backward pass of ``batch`` without an optimizer step: what
    ``train.precision=auto`` times in each precision (seq2seq.precision.choose)."""
    def one_pass() -> None:
        total = run.model(batch.src, batch.src_lens, batch.tgt_in, targets=batch.tgt_out)
        (total / batch.n_tgt_tokens).backward()
        run.model.zero_grad(set_to_none=True)

    return one_pass


def autocast(run: Run) -> contextlib.AbstractContextManager:
    """The run's precision: bf16 autocast, or the fused loss's (and the other large)
    products in bf16 (seq2seq.precision.applied), or nothing."""
    return precision.applied(precision_of(run), run.device)


def precision_of(run: Run) -> precision.Choice:
    """The precision ``run`` trains in (its flags as a Choice, without a reason)."""
    return precision.Choice(run.bf16, "", run.loss_bf16, run.gemm_bf16)


def train_step(run: Run, batch: batching.Batch, scale: float = 1.0) -> torch.Tensor:
    """One optimizer update on ``batch``; returns the mean token loss (a 0-dim tensor, no sync)."""
    t = run.cfg.train
    run.optimizer.zero_grad(set_to_none=True)
    with autocast(run):
        total = (run.net or run.model)(batch.src, batch.src_lens, batch.tgt_in,
                                       teacher_forcing=t.teacher_forcing, targets=batch.tgt_out,
                                       label_smoothing=t.label_smoothing)
    # scale: this rank's weight in a global batch (distributed.local_batch); 1 for one process
    loss = total * scale / batch.n_tgt_tokens
    loss.backward()
    if t.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), t.clip_norm)
    run.optimizer.step()
    if not isinstance(run.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        run.scheduler.step()
    return distributed.mean_over_ranks(loss.detach())


def dev_scores(run: Run) -> tuple[float, list[dict[str, Any]]]:
    """(dev loss, dev scores by source-length bucket; empty when dev BLEU is off)."""
    t = run.cfg.train
    return validation.dev_scores(run.model, run.data, run.tokenizers, t.valid_bleu_sentences,
                                 t.batch_tokens, run.device, lambda: autocast(run))


def validate(run: Run) -> dict[str, float]:
    """Dev loss, perplexity and BLEU; steps the plateau schedule, tracks the best, saves checkpoints."""
    p, t = run.progress, run.cfg.train
    loss, buckets = distributed.on_main(lambda: dev_scores(run))  # torchrun: rank 0 scores for all
    bleu = validation.overall_bleu(buckets)
    if isinstance(run.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        run.scheduler.step(loss)
    score = bleu if t.valid_bleu_sentences > 0 else -loss
    p.last_valid_step = p.step
    improved = score > p.best_score
    if improved:
        p.best_score, p.best_step, p.best_bleu, p.bad_validations = score, p.step, bleu, 0
    else:
        p.bad_validations += 1
    save(run, LAST)  # first: a kill between the two writes must not leave best.pt ahead of last.pt
    if improved:
        save(run, BEST)
    if t.keep_checkpoints and distributed.is_main():
        keep_checkpoint(run.log.dir, p.step, t.keep_checkpoints)
    if run.log.wants_attention:
        run.log.attention(p.step, validation.attention_samples(run.model, run.data, run.tokenizers,
                                                               run.device))
    ppl = math.exp(min(loss, 50.0))
    run.log.info("step %d epoch %d: dev loss %.4f ppl %.2f BLEU %.2f (best %.2f at step %d)",
                 p.step, p.epoch, loss, ppl, bleu, p.best_bleu, p.best_step)
    if buckets:
        run.log.dev_buckets(p.step, p.epoch, p.elapsed_s, buckets)
        run.log.info("  dev BLEU by source words: %s", ", ".join(
            f"{r['bucket']} {r['bleu']:.1f}" for r in buckets if r["bucket"] != "all"))
    if not run.native_logged:  # by now training, the dev loss and dev decoding have chosen
        run.native_logged = True
        run.log.info("native kernels: %s", native.status())
    return {"dev_loss": loss, "dev_ppl": ppl, "dev_bleu": bleu}


def save(run: Run, name: str) -> None:
    """Write checkpoint ``name`` (rank 0). Every rank calls it at the same step: each one's
    RNG state goes in, so a resume under torchrun continues every rank's random stream."""
    run.saved_at = time.perf_counter()
    rngs = distributed.gather_objects(capture_rng_state())
    if not distributed.is_main():
        return
    vocab = {"src": run.tokenizers.src.vocab_size, "tgt": run.tokenizers.tgt.vocab_size}
    run.progress.native_choices = native.choices()
    ckpt = make_checkpoint(run.model, run.optimizer, run.scheduler, asdict(run.progress), run.cfg,
                           vocab, run.identity)
    ckpt["rng_per_rank"] = rngs
    atomic_save(ckpt, run.log.dir / name)


# ---------------------------------------------------------------- the loop


def stop_reason(run: Run) -> str:
    """Why training must stop now ('' to go on)."""
    p, t = run.progress, run.cfg.train
    if run.stop is not None and distributed.any_rank(bool(run.stop.received)):
        return f"signal {run.stop.name or 'on another rank'}"
    if t.max_steps and p.step >= t.max_steps:
        return f"max_steps={t.max_steps}"
    if t.max_minutes and distributed.slowest(p.elapsed_s) >= 60 * t.max_minutes:
        return f"max_minutes={t.max_minutes:g}"
    if t.patience and p.bad_validations >= t.patience:
        return f"early stop: no dev improvement in {t.patience} validations"
    if p.epoch >= t.max_epochs:
        return f"max_epochs={t.max_epochs}"
    return ""


def epoch_batches(run: Run) -> list[np.ndarray]:
    """This epoch's batches (pair indices); with ``overfit_batches`` the same few every epoch."""
    p, t, d = run.progress, run.cfg.train, run.data
    if t.overfit_batches:
        return batching.train_batches(d.train, d.train_idx, t.batch_tokens, t.seed, 0)[: t.overfit_batches]
    return batching.train_batches(d.train, d.train_idx, t.batch_tokens, t.seed, p.epoch)


def total_steps(run: Run, steps_per_epoch: int) -> int:
    t = run.cfg.train
    bound = t.max_epochs * steps_per_epoch
    return min(bound, t.max_steps) if t.max_steps else bound


def run_training(run: Run) -> Progress:
    """Train until a budget, the epoch limit or early stopping ends it."""
    p, t, d = run.progress, run.cfg.train, run.data
    run.model.train()
    start, elapsed_before = time.perf_counter(), p.elapsed_s
    window = Window()
    p.stop_reason = stop_reason(run)  # a resumed run may have nothing left to do
    bar = run.log.progress(None, p.step)
    with logging_redirect_tqdm([run.log.console_logger]), bar, preempt.StopSignals() as run.stop:
        while not p.stop_reason:
            batches = epoch_batches(run)
            bar.total = bar.total or total_steps(run, len(batches))
            for idx in batches[p.batch_index:]:
                batch, scale = distributed.local_batch(d.train, idx)
                batch = validation.to_device(batch, run.device)
                cpu_start, step_start = contention.cpu_seconds(), time.perf_counter()
                loss = train_step(run, batch, scale)
                step_s = time.perf_counter() - step_start
                window.add(loss, batch.n_tgt_tokens, batch.n_src_tokens, step_s,
                           contention.cpu_seconds() - cpu_start)
                p.step, p.batch_index = p.step + 1, p.batch_index + 1
                p.tgt_tokens += batch.n_tgt_tokens
                p.src_tokens += batch.n_src_tokens
                p.train_s += step_s
                p.elapsed_s = elapsed_before + time.perf_counter() - start
                bar.update(1)
                if p.step % t.log_every == 0:
                    log_train(run, window, bar)
                if p.step % t.valid_every == 0:
                    validate_and_log(run)
                    p.elapsed_s = elapsed_before + time.perf_counter() - start
                elif t.save_every_minutes and distributed.any_rank(
                        time.perf_counter() - run.saved_at >= 60 * t.save_every_minutes):
                    save(run, LAST)  # mid-epoch: batch_index says where to pick up
                p.stop_reason = stop_reason(run)
                if p.stop_reason:
                    break
            else:  # the epoch ran to its end (overfit "epochs" are too short to validate)
                if p.last_valid_step != p.step and t.valid_at_epoch_end and not t.overfit_batches:
                    validate_and_log(run)
                p.epoch, p.batch_index = p.epoch + 1, 0
                p.stop_reason = stop_reason(run)
        p.elapsed_s = elapsed_before + time.perf_counter() - start
        if p.last_valid_step != p.step and not run.stop.received:
            validate_and_log(run)
        else:  # record the stop reason and the final clock; a signal asks for no validation
            save(run, LAST)
    return p


def log_train(run: Run, window: Window, bar: Any) -> None:
    """Average the last ``log_every`` steps into one metrics row, a log line and the bar."""
    p = run.progress
    loss = window.mean_loss()
    if not math.isfinite(loss):
        raise Seq2SeqError(
            f"training diverged at step {p.step} (loss {loss}): lower train.lr or set train.clip_norm")
    lr = run.optimizer.param_groups[0]["lr"]
    run.log.metrics(step=p.step, epoch=p.epoch, train_loss=loss, lr=lr, elapsed_s=p.elapsed_s,
                    tgt_tok_per_s=window.tgt_per_s(), src_tok_per_s=window.src_per_s())
    bar.set_postfix({"tgt tok/s": f"{window.tgt_per_s():,.0f}", "loss": f"{loss:.3f}",
                     "eta": format_duration(time_left(run, bar.total))}, refresh=False)
    run.log.info("step %d epoch %d: loss %.4f lr %.2e %.0f tgt tok/s",
                 p.step, p.epoch, loss, lr, window.tgt_per_s())
    warn_busy_cores(run, window)
    window.reset()


def warn_busy_cores(run: Run, window: Window) -> None:
    """Warn when the window's steps ran on cores another process took (seq2seq.contention),
    once until they are free again, and say when they are. Not under DDP: a rank that waits
    for another's gradients may sleep, which lowers its share without any other process."""
    if not contention.measurable(run.device) or distributed.world_size() > 1:
        return
    cores = window.cores()
    if cores.wall < contention.MIN_WALL:  # too short to say either way
        return
    busy = cores.busy()
    if busy and not run.busy_cores:
        run.log.warning("steps %d-%d ran on busy cores (%s): %s", run.progress.step - window.steps + 1,
                        run.progress.step, contention.describe(cores.share()), contention.ADVICE)
    elif run.busy_cores and not busy:
        run.log.info("the cores are free again (%s)", contention.describe(cores.share()))
    run.busy_cores = busy


def time_left(run: Run, total: int | None) -> float:
    """Seconds left: the nearer of the step/epoch bound and the max_minutes budget."""
    p, t = run.progress, run.cfg.train
    left = math.inf
    if total and p.step:
        left = (total - p.step) * p.elapsed_s / p.step
    if t.max_minutes:
        left = min(left, 60 * t.max_minutes - p.elapsed_s)
    return left


def validate_and_log(run: Run) -> None:
    p = run.progress
    dev = validate(run)
    run.log.metrics(step=p.step, epoch=p.epoch, lr=run.optimizer.param_groups[0]["lr"],
                    elapsed_s=p.elapsed_s, **dev)


def summarize(run: Run) -> dict[str, Any]:
    p = run.progress
    return {
        "steps": p.step,
        "epochs_completed": p.epoch,
        "stop_reason": p.stop_reason,
        "best_dev_bleu": None if math.isnan(p.best_bleu) else p.best_bleu,
        "best_step": p.best_step,
        "wall_time_s": round(p.elapsed_s, 1),
        "train_time_s": round(p.train_s, 1),
        "mean_tgt_tok_per_s": round(p.tgt_tokens / max(p.train_s, 1e-9), 1),
        "mean_src_tok_per_s": round(p.src_tokens / max(p.train_s, 1e-9), 1),
        "train_pairs": len(run.data.train_idx),
        "dropped_pairs": run.data.dropped,
        "attention": run.cfg.model.attention.name,
        "precision": p.precision,
        "fp32_gemm": p.fp32_gemm,
        "bf16_gemm": p.bf16_gemm,
        "native_choices": native.choices(),  # two runs of a seed agree only where these do
        **distributed.batch_record(run.cfg.train.batch_tokens),
    }


def train_main(cfg: DictConfig) -> Path:
    """`seq2seq-train`: train one model into ``cfg.run_dir`` and return that folder."""
    # before anything times a path; a resume's kept paths (setup) still win over fixed ones
    with native.fixed_paths(cfg.train.deterministic):
        return _train(cfg)


def _train(cfg: DictConfig) -> Path:
    run = setup(cfg)
    try:
        route = choose_gemm(run)
        with gemm.using(route):  # the precision probe times fp32 passes on the chosen route
            choose_precision(run)
        with gemm.using(bf16_route(run, route)):
            run.net = distributed.prepare(run)
            p = run_training(run)
        if run.stop.received:
            raise preempt.Preempted(
                f"{run.stop.name} at step {p.step}: checkpoint saved in {run.log.dir / LAST}; continue "
                f"with `seq2seq-train run_dir={run.log.dir} train.resume=true` (in a reproduction: "
                "run the same seq2seq-reproduce command again)", run.stop.received)
        summary = summarize(run)
        run.log.write_json("summary.json", summary)
        run.log.info("done (%s): %d steps, best dev BLEU %.2f at step %d, %.0f tgt tok/s, %.0f s",
                     summary["stop_reason"], summary["steps"], p.best_bleu,
                     summary["best_step"], summary["mean_tgt_tok_per_s"], summary["wall_time_s"])
        distributed.shutdown(wait=True)  # the other ranks wait until rank 0 has written everything
    finally:
        run.log.close()
        if run.lock is not None:
            run.lock.release()
        distributed.shutdown(wait=False)  # a failed rank leaves at once, so torchrun stops the rest
    return run.log.dir
