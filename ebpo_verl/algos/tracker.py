"""The per-prompt Beta(alpha, beta) tracker shared by ``spo`` (its tracker) and ``dbb`` (its posteriors): sorted
stable prompt keys with their pseudo-counts (numpy only, no verl import).

verl's uid is drawn afresh every step, so a prompt is identified across steps by a stable key (``extra_info``'s
``prompt_key`` field). The saved form (:meth:`PromptTracker.state_dict`) is the one both estimators wrote before
they shared this class: ``{"version": 1, "steps", "keys", "alpha", "beta"}``, keys sorted and unique.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ebpo_verl.algos.estimator import Batch, FreshState, saved_fields
from ebpo_verl.algos.grouping import Groups
from ebpo_verl.options.parsing import is_real, option, text

TRACKER_VERSION = 1
COLUMNS = ("keys", "alpha", "beta")


@dataclass
class PromptTracker(FreshState):
    """Sorted prompt keys with their (alpha, beta), and the number of estimator calls that updated them."""

    label: ClassVar[str] = "tracker"
    """The estimator's name in messages (``SPO state ...``)."""

    steps: int = 0
    keys: np.ndarray = field(default_factory=lambda: np.array([], dtype=str))
    alpha: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.float64))
    beta: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.float64))

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in the tracker, found) of each key of the sorted, unique array ``keys``."""
        pos = np.searchsorted(self.keys, keys)
        inside = np.minimum(pos, max(len(self.keys) - 1, 0))
        found = (pos < len(self.keys)) & (self.keys[inside] == keys) if len(self.keys) else np.zeros(len(keys), bool)
        return inside, found

    def counts(self, pos: np.ndarray, found: np.ndarray, prior: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta) of the looked-up keys (:meth:`lookup`): the tracked ones, ``prior`` for the others."""
        alpha, beta = np.full(len(found), prior[0]), np.full(len(found), prior[1])
        alpha[found], beta[found] = self.alpha[pos[found]], self.beta[pos[found]]
        return alpha, beta

    def update(self, keys: np.ndarray, pos: np.ndarray, found: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> None:
        """Store the new (alpha, beta) of the looked-up ``keys`` (new keys merged in sorted order); one more step."""
        self.alpha[pos[found]], self.beta[pos[found]] = alpha[found], beta[found]
        if not found.all():
            merged = np.concatenate([self.keys, keys[~found]])
            order = np.argsort(merged, kind="stable")
            self.keys = merged[order]
            self.alpha = np.concatenate([self.alpha, alpha[~found]])[order]
            self.beta = np.concatenate([self.beta, beta[~found]])[order]
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        columns = {name: getattr(self, name).tolist() for name in COLUMNS}
        return {"version": TRACKER_VERSION, "steps": self.steps, **columns}

    def load_state_dict(self, state: Any) -> None:
        """Restore a :meth:`state_dict` snapshot; every field is checked, and a bad one raises ValueError naming it,
        leaving this tracker unchanged."""
        what = f"{self.label} state"
        steps, *columns = saved_fields(state, what, TRACKER_VERSION, ("steps", *COLUMNS), ("steps",))
        for name, values in zip(COLUMNS, columns, strict=True):
            if not isinstance(values, list) or any(isinstance(v, (list, dict)) for v in values):
                raise ValueError(f"{what} {name} must be a flat list, got {values!r:.60}")
        if not all(isinstance(k, str) for k in columns[0]):
            raise ValueError(f"{what} keys must be strings")
        if not all(is_real(v) for v in columns[1] + columns[2]):
            raise ValueError(f"{what} alpha/beta must be finite numbers")
        keys = np.array(columns[0], dtype=str)
        alpha, beta = (np.array(c, dtype=np.float64) for c in columns[1:])
        if not (len(keys) == len(alpha) == len(beta)):
            raise ValueError(f"{what} has {len(keys)} keys but {len(alpha)} alpha and {len(beta)} beta values")
        if len(keys) and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError(f"{what} keys are not sorted and unique")
        if not ((alpha > 0).all() and (beta > 0).all()):
            raise ValueError(f"{what} has non-positive alpha/beta values")
        self.__init__(steps, keys, alpha, beta)


def prompt_key_option(help: str) -> Any:
    """The declaration of a per-prompt tracker's ``prompt_key``: the extra_info field naming each prompt (default
    ``index``, the row index ebpo_verl.data writes)."""
    return option("index", help, rule=text("an extra_info field name"))


def prompt_groups(batch: Batch, name: str, what: str, prompt_key: str) -> Groups:
    """The valid rows of a per-prompt estimator (``spo``, ``dbb``) grouped by their stable prompt keys, the batch's
    ``row_values`` (compared as strings; None/NaN only on padding rows; rows whose uid starts with ``pad_prefix``
    are padding). Without them ValueError: verl's uids are fresh every step, so a uid-keyed ``what`` would never
    see a prompt twice."""
    if batch.row_values is None:
        raise ValueError(
            f"adv_estimator={name} needs a stable prompt key per row (verl's uid is drawn afresh every step, "
            f"so a uid-keyed {what} never sees a prompt twice): train with `python -m ebpo_verl.main`, which passes "
            f"extra_info[{prompt_key!r}] (algorithm.{name}.prompt_key), or pass prompt_keys=..."
        )
    return batch.key_groups(batch.row_values, f"prompt key(s) (extra_info[{prompt_key!r}])")
