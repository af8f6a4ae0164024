"""The one decoding thread: concurrent requests queue here and are batched together.

A model is not safe to run from several threads at once (and two decodes on a 2-core
machine would only slow each other down), so every decode happens on this thread, one
batch at a time. Requests wait in a bounded queue; when the thread picks up work it
takes everything waiting and decodes the jobs that share (model, beam, nbest) as one
list: :meth:`seq2seq.inference.translator.Translator.translate` sorts them into length-sorted
batches, and a sentence's result does not depend on its companions, so a request gets
the same answer alone or batched with others.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


class QueueFull(Exception):
    """More decoding jobs are waiting than the server's ``limits.max_queue``."""


@dataclass
class Job:
    """Sentences for one model; ``future`` gets their Translations, in order."""

    model: str
    sentences: list[str]
    beam: int
    nbest: int
    future: Future

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.model, self.beam, self.nbest)


class DecodeWorker:
    """Owns the models' decoding: :meth:`submit` from any thread, decoding on one.

    ``models`` maps a name to an object with ``translate(sentences, beam, nbest)``
    (seq2seq.serve.models.ServedModel). ``threads`` > 0 sets torch's intra-op threads
    on the decoding thread (torch's setting is per process, so it is set once here).
    """

    def __init__(self, models: Mapping[str, Any], max_queue: int, threads: int = 0,
                 max_batch_sentences: int = 64) -> None:
        self.models = dict(models)
        self.threads = threads
        self.max_batch_sentences = max_batch_sentences
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self.decoded_sentences = 0  # served so far (health endpoint)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decode", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the job in hand, then stop; jobs still waiting are cancelled."""
        if self._thread is None:
            return
        while True:  # drop waiting jobs so the sentinel fits into a full queue
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.cancel()
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def submit(self, model: str, sentences: Sequence[str], beam: int, nbest: int) -> Future:
        """Queue a job; its future gets a list of Translations. QueueFull when the queue is."""
        job = Job(model, list(sentences), beam, nbest, Future())
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return job.future

    def _run(self) -> None:
        if self.threads > 0:
            import torch

            torch.set_num_threads(self.threads)
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            while True:  # everything waiting now joins this round
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:  # stop after this round
                    self._queue.put(None)
                    break
                jobs.append(job)
            for group in group_jobs(jobs, self.max_batch_sentences):
                self._decode(group)

    def _decode(self, group: list[Job]) -> None:
        """Decode the jobs of one (model, beam, nbest) as one list; a job whose client gave
        up (its future cancelled, e.g. by the request timeout) is skipped."""
        live = [job for job in group if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        model, beam, nbest = live[0].key
        sentences = [s for job in live for s in job.sentences]
        try:
            results = self.models[model].translate(sentences, beam=beam, nbest=nbest)
        except Exception as err:  # reported to each request, never kills the thread
            for job in live:
                job.future.set_exception(err)
            return
        self.decoded_sentences += len(sentences)
        start = 0
        for job in live:
            job.future.set_result(results[start:start + len(job.sentences)])
            start += len(job.sentences)


def group_jobs(jobs: list[Job], max_sentences: int) -> list[list[Job]]:
    """Jobs grouped by (model, beam, nbest), in the order of their first job; a group is
    split before it would pass ``max_sentences``, so the first requests are not kept
    waiting for a long tail (a job is never split)."""
    groups: list[list[Job]] = []
    open_group: dict[tuple[str, int, int], list[Job]] = {}
    for job in jobs:
        group = open_group.get(job.key)
        if group is None or sum(len(j.sentences) for j in group) + len(job.sentences) > max_sentences:
            group = open_group[job.key] = []
            groups.append(group)
        group.append(job)
    return groups
