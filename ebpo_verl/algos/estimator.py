"""What an estimator with memory is: an object holding its options, its state and its last diagnostics.

verl's ``core_algos`` estimators are pure functions of one batch. EBPO's running statistics, SPO's tracker and
DBB's posteriors live across steps, and BNPO reports a diagnostic of every call; rather than module-level
singletons that every caller reaches sideways, each is an :class:`Estimator` instance that its owner creates and
keeps: the trainer (one per run, saved with every checkpoint), a study run, a test. The math stays in pure
functions of (batch, options, state) that return :class:`Advantages`, in the style of ``core_algos``; the object
only binds them to one options value and one state, so whoever calls it shows which state it changes.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from ebpo_verl.algos.grouping import unpadded


class Batch(NamedTuple):
    """One step's inputs: ``scores`` (bs,), prompt uids ``index``, ``valid`` False for padding rows,
    ``row_values`` the per-row field the options name (cluster label, stable prompt key; None: none),
    ``pad_prefix`` uids that are padding too (None: none)."""

    scores: torch.Tensor
    index: np.ndarray
    valid: torch.Tensor
    row_values: np.ndarray | None = None
    pad_prefix: str | None = None

    def unpadded_valid(self) -> torch.Tensor:
        """``valid`` on the CPU less the rows whose uid starts with ``pad_prefix`` (:func:`grouping.unpadded`), for
        estimators that group by another key than the uid."""
        return unpadded(self.valid, self.index, self.pad_prefix)


class Advantages(NamedTuple):
    """One estimator call's result: per-row advantages (shape ``(bs,)``) and the step's diagnostics (metrics)."""

    values: torch.Tensor
    diagnostics: dict[str, float]


class Estimator:
    """Base of the estimators with memory: ``options``, ``state`` (None for a stateless one), ``diagnostics`` of
    the last call. Calling it computes one step's advantages, updating ``state`` in place.

    Subclasses set ``state_cls`` (None: no state) and implement :meth:`compute`.
    """

    state_cls: ClassVar[type | None] = None

    def __init__(self, options: Any = None) -> None:
        self.options = options
        self.state = self.state_cls() if self.state_cls is not None else None
        self.diagnostics: dict[str, float] = {}

    def __call__(
        self,
        scores: torch.Tensor,
        index: np.ndarray,
        valid: torch.Tensor,
        row_values: np.ndarray | None = None,
        pad_prefix: str | None = None,
    ) -> Advantages:
        """Advantages of one batch (the arguments of :class:`Batch`); ``diagnostics`` then holds the step's."""
        result = self.compute(Batch(scores, index, valid, row_values, pad_prefix))
        self.diagnostics = result.diagnostics
        return result

    def compute(self, batch: Batch) -> Advantages:
        """One step on ``batch`` with ``options``, updating ``state``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the state and the diagnostics (a fresh run)."""
        if self.state is not None:
            self.state.reset()
        self.diagnostics = {}
