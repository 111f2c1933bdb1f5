"""What an estimator with memory is: an object holding its options, its state and its last diagnostics.

verl's ``core_algos`` estimators are pure functions of one batch. EBPO's running statistics, SPO's tracker and
DBB's posteriors live across steps, and BNPO reports a diagnostic of every call; rather than module-level
singletons that every caller reaches sideways, each is an :class:`Estimator` instance that its owner creates and
keeps: the trainer (one per run, saved with every checkpoint), a study run, a test. The math stays in pure
functions ``compute_<name>_advantages(batch, options, state)`` (the parts the estimator has: a :class:`Batch`,
its options section, its state) that return :class:`Advantages`, in the style of ``core_algos``; the object only
binds them to one options value and one state, so whoever calls it shows which state it changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from ebpo_verl.algos.grouping import Groups, group_rows, unpadded


class Batch(NamedTuple):
    """One step's inputs: ``scores`` (bs,), prompt uids ``index`` (compared as strings), ``valid`` False for
    padding rows, ``row_values`` the per-row field the options name (cluster label, stable prompt key, sample
    index; None: none), ``pad_prefix`` uids that are padding too (None: none)."""

    scores: torch.Tensor
    index: Sequence[Any] | np.ndarray
    valid: torch.Tensor
    row_values: Sequence[Any] | np.ndarray | None = None
    pad_prefix: str | None = None

    def uid_groups(self) -> Groups:
        """The valid rows grouped by uid (:func:`grouping.group_rows`); rows whose uid starts with ``pad_prefix`` are
        padding too."""
        return group_rows(self.scores, self.index, self.valid, "uid(s)", self.pad_prefix)

    def key_groups(self, keys: Sequence[Any] | np.ndarray, what: str) -> Groups:
        """The valid rows grouped by another per-row key than the uid (a stable prompt key, a domain; ``what`` names
        it in errors); rows whose uid starts with ``pad_prefix`` are padding (:func:`grouping.unpadded`)."""
        return group_rows(self.scores, keys, unpadded(self.valid, self.index, self.pad_prefix), what)


class Advantages(NamedTuple):
    """One estimator call's result: per-row advantages (shape ``(bs,)``) and the step's diagnostics (metrics)."""

    values: torch.Tensor
    diagnostics: dict[str, float]


class Estimator:
    """Base of the estimators with memory: ``options``, ``state`` (None for a stateless one), ``diagnostics`` of
    the last call. Calling it computes one step's advantages, updating ``state`` in place.

    Subclasses set ``state_cls`` (None: no state) and ``pure_function``, the math they bind (as a staticmethod):
    ``(batch, options, state) -> Advantages``, or ``(batch, options)`` without a state; or override :meth:`compute`.
    """

    state_cls: ClassVar[type | None] = None
    pure_function: ClassVar[Callable[..., Advantages] | None] = None

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
        """One step on ``batch`` with ``options``, updating ``state``: ``pure_function`` of them."""
        if self.pure_function is None:
            raise NotImplementedError(f"{type(self).__name__} sets no pure_function and does not override compute")
        if self.state is None:
            return self.pure_function(batch, self.options)
        return self.pure_function(batch, self.options, self.state)

    def reset(self) -> None:
        """Forget the state and the diagnostics (a fresh run)."""
        if self.state is not None:
            self.state.reset()
        self.diagnostics = {}
