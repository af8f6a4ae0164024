"""Ensembles: several trained runs decoded as one model through the same search.

``Ensemble`` offers what search needs (``encode``, ``init_state``, ``step``; see
:mod:`seq2seq.inference.search`) and nothing else. At each output step it averages the member
models' log-probabilities,

    log p_ens(y_t | y_<t, x) = (1/M) sum_m log p_m(y_t | y_<t, x),

which search then renormalises with its own ``log_softmax`` (the normalised geometric
mean of the members' distributions, as OpenNMT-py's ensemble decoder does). The
attention weights it reports are the members' mean, so a heatmap of an ensemble shows
where the members attend on average (all zero when no member has attention).

Members must share their tokenizers, since the ids they read and write must mean the
same subwords; :func:`load_models` refuses a mix with one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from seq2seq.errors import CheckpointError


@dataclass
class EnsembleMemory:
    """One Memory per member, expanded and reordered together (beam rows, retiring sentences)."""

    members: list[Any]

    def index_select(self, index: Tensor) -> EnsembleMemory:
        return EnsembleMemory([m.index_select(index) for m in self.members])

    def repeat_rows(self, k: int) -> EnsembleMemory:
        return EnsembleMemory([m.repeat_rows(k) for m in self.members])


@dataclass
class EnsembleState:
    """One DecoderState per member, reordered together."""

    members: list[Any]

    def index_select(self, index: Tensor) -> EnsembleState:
        return EnsembleState([s.index_select(index) for s in self.members])


class Ensemble(nn.Module):
    """Models that decode as one: mean log-probabilities, mean attention."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        if not models:
            raise CheckpointError("an ensemble needs at least one model")
        self.members = nn.ModuleList(models)

    def encode(self, src: Tensor, src_lens: Tensor) -> EnsembleMemory:
        """src (B, S), src_lens (B,) -> each member's Memory."""
        return EnsembleMemory([m.encode(src, src_lens) for m in self.members])

    def init_state(self, memory: EnsembleMemory) -> EnsembleState:
        return EnsembleState([m.init_state(mem) for m, mem in
                              zip(self.members, memory.members, strict=True)])

    def step(self, y_prev: Tensor, state: EnsembleState, memory: EnsembleMemory
             ) -> tuple[Tensor, EnsembleState, Tensor]:
        """y_prev (B,) -> mean log-probabilities (B, V) fp32, new states, mean weights (B, S)."""
        logps, states, weights = [], [], []
        for model, st, mem in zip(self.members, state.members, memory.members, strict=True):
            logits, new_state, w = model.step(y_prev, st, mem)
            logps.append(torch.log_softmax(logits.float(), dim=-1))
            states.append(new_state)
            weights.append(w.float())
        return (torch.stack(logps).mean(dim=0), EnsembleState(states),
                torch.stack(weights).mean(dim=0))


def run_list(run: Any) -> list[str]:
    """``run=`` as a list of paths: one path, or the members of an ensemble."""
    if isinstance(run, str | Path):
        return [str(run)]
    return [str(r) for r in run]


def load_models(run: Any, device: str | torch.device = "cpu"
                ) -> tuple[nn.Module, Any, DictConfig]:
    """``(model, tokenizers, cfg)`` for one run (folder or .pt) or a list of them.

    A list of two or more becomes an :class:`Ensemble`; ``cfg`` is the first member's.
    CheckpointError, naming both runs, when a member's tokenizers differ from the first's.
    """
    from seq2seq.runs.checkpoint import load_model

    paths = run_list(run)
    if not paths:
        raise CheckpointError("run=[] names no model: pass a run folder, or several for an ensemble")
    loaded = [load_model(p, device=device) for p in paths]
    model, tokenizers, cfg = loaded[0]
    if len(loaded) == 1:
        return model, tokenizers, cfg
    first = tokenizers.identity()
    for path, (_, toks, _) in zip(paths[1:], loaded[1:], strict=True):
        if toks.identity() != first:
            raise CheckpointError(
                f"cannot ensemble {paths[0]} and {path}: their tokenizers differ (the same "
                "ids would mean different subwords); ensemble runs trained on the same "
                "corpus with the same tokenizer settings")
    return Ensemble([m for m, _, _ in loaded]).eval(), tokenizers, cfg
