"""What an estimator is: a pure function of one batch, and the one object that binds it to a run's options and state.

The math is pure ``compute_<name>_advantages(batch, options[, state])`` returning :class:`Advantages`, as verl's
``core_algos``; running state (EBPO's statistics, SPO's tracker, DBB's posteriors) is no module-level singleton:
each run owns one :class:`Estimator` (:func:`ebpo_verl.algos.registry.new_estimator`, the one factory), which binds
the function to one options value and one :class:`State`, so whoever calls it shows which state it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from ebpo_verl.algos.grouping import Groups, group_rows


class Batch(NamedTuple):
    """One step's inputs: ``scores`` (bs,), prompt uids ``index`` (compared as strings), ``valid`` False for
    padding rows, ``row_values`` what the estimator reads per row (its spec's ``row_input``: an ``extra_info``
    field or the rollout sample index; None: none), ``pad_prefix`` uids that are padding too (None: none)."""

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
        it in errors); rows whose uid starts with ``pad_prefix`` are padding."""
        return group_rows(self.scores, keys, self.valid, what, self.pad_prefix, self.index)


class Advantages(NamedTuple):
    """One estimator call's result: per-row advantages (shape ``(bs,)``) and the step's diagnostics (metrics)."""

    values: torch.Tensor
    diagnostics: dict[str, float]


@runtime_checkable
class State(Protocol):
    """The contract of an estimator's running state (its spec's ``StateSpec.cls``), checked at registration: a
    fresh ``cls()`` is the state of a new run; ``state_dict()`` a JSON-serialisable snapshot (floats round-trip
    exactly), ``load_state_dict(d)`` restores one (a field outside its domain raises ValueError naming it, leaving
    the state unchanged), ``reset()`` makes it fresh again. The math changes it in place. The package's states
    (:class:`FreshState`) declare their fields to :mod:`ebpo_verl.algos.state_codec` and also take the options
    the state was written under, ``load_state_dict(d, options)``, for bounds an option sets."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any) -> None: ...

    def reset(self) -> None: ...


class FreshState:
    """Base of the package's state dataclasses: :meth:`reset` is a fresh ``cls()``."""

    def reset(self) -> None:
        self.__init__()


class Estimator:
    """One run's estimator: its ``spec`` (:class:`~ebpo_verl.algos.registry.EstimatorSpec`), ``options`` (None
    without an options section), ``state`` (None for a stateless one) and ``diagnostics`` of the last call.
    Calling it runs ``spec.compute`` on one batch, updating ``state`` in place. Made by
    :func:`ebpo_verl.algos.registry.new_estimator`."""

    def __init__(self, spec: Any, options: Any = None) -> None:
        self.spec, self.options = spec, options
        self.state: State | None = spec.state.cls() if spec.state is not None else None
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
        parts = (self.options,) if self.spec.options_cls is not None else ()
        parts += () if self.state is None else (self.state,)
        result = self.spec.compute(Batch(scores, index, valid, row_values, pad_prefix), *parts)
        self.diagnostics = result.diagnostics
        return result

    def reset(self) -> None:
        """Forget the state and the diagnostics (a fresh run)."""
        if self.state is not None:
            self.state.reset()
        self.diagnostics = {}
