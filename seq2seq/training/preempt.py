"""Stop training cleanly on a signal: SIGTERM, SIGINT (Ctrl-C) and SIGUSR1.

Clusters send SIGTERM (Slurm: SIGTERM, or SIGUSR1 with ``--signal``) some seconds
before they kill a job. While :class:`StopSignals` is active, such a signal only sets
a flag; the training loop reads it at the next step boundary (a step is never cut in
half), saves ``last.pt`` and raises :class:`Preempted`, whose one-line message says how
to resume. A second Ctrl-C while the checkpoint is being written is ignored, so the
file is never left half-written; SIGKILL cannot be caught, which is why checkpoints are
written atomically.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from seq2seq.errors import Seq2SeqError

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1")
                if hasattr(signal, name))


class Preempted(Seq2SeqError):
    """Training stopped on a signal after saving its checkpoint; ``code`` is the exit status
    (128 + the signal number, as a shell reports a process killed by it)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.code = 128 + signum


class StopSignals:
    """Context manager: the signals of :data:`SIGNALS` set :attr:`received` instead of
    ending the process. A no-op outside the main thread (Python delivers signals there)."""

    def __init__(self) -> None:
        self.received: int = 0
        self._old: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.received:
            self.received = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
