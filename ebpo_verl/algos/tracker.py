"""The per-prompt Beta(alpha, beta) tracker shared by ``spo`` (its tracker) and ``dbb`` (its posteriors): sorted
stable prompt keys with their pseudo-counts (numpy only, no verl import).

verl's uid is drawn afresh every step, so a prompt is identified across steps by a stable key (``extra_info``'s
``prompt_key`` field). The saved form (:meth:`PromptTracker.state_dict`) is the one both estimators wrote before
they shared this class: ``{"version": 1, "steps", "keys", "alpha", "beta"}``, keys sorted and unique.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ebpo_verl.algos.estimator import Batch, FreshState
from ebpo_verl.algos.grouping import Groups
from ebpo_verl.algos.state_codec import COUNT, KEY, MAX_COUNT, WEIGHT, Record, Seq, decode, refuse, saturated
from ebpo_verl.ops.errors import shorten
from ebpo_verl.options.parsing import option, text

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
    FIELDS: ClassVar[Record] = Record(
        {"steps": COUNT, "keys": Seq(KEY, increasing=True), "alpha": Seq(WEIGHT), "beta": Seq(WEIGHT)},
        same_length=COLUMNS,
        version=TRACKER_VERSION,
    )
    """The saved form, field by field (:mod:`ebpo_verl.algos.state_codec`): pseudo-counts in [0, 2**53]."""

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
        """Store the new (alpha, beta) of the looked-up ``keys`` (new keys merged in sorted order; pseudo-counts and
        steps saturate at 2**53, the edge of their saved domain); one more step."""
        alpha, beta = np.minimum(alpha, MAX_COUNT), np.minimum(beta, MAX_COUNT)
        self.alpha[pos[found]], self.beta[pos[found]] = alpha[found], beta[found]
        if not found.all():
            merged = np.concatenate([self.keys, keys[~found]])
            order = np.argsort(merged, kind="stable")
            self.keys = merged[order]
            self.alpha = np.concatenate([self.alpha, alpha[~found]])[order]
            self.beta = np.concatenate([self.beta, beta[~found]])[order]
        self.steps = saturated(self.steps)

    def state_dict(self) -> dict[str, Any]:
        columns = {name: getattr(self, name).tolist() for name in COLUMNS}
        return {"version": TRACKER_VERSION, "steps": self.steps, **columns}

    def load_state_dict(self, state: Any, options: Mapping[str, Any] | None = None) -> None:
        """Restore a :meth:`state_dict` checked by :data:`FIELDS`, each key's alpha + beta > 0 (a baseline
        alpha / (alpha + beta)); a refused field leaves this tracker unchanged."""
        decode(self.FIELDS, state, f"{self.label} state:", options)
        alpha, beta = (np.array(state[c], dtype=np.float64) for c in COLUMNS[1:])
        empty = np.flatnonzero(alpha + beta <= 0)
        if len(empty):
            where = f"{self.label} state: alpha + beta of key {shorten(state['keys'][empty[0]])}"
            raise refuse(where, 0.0, "> 0 (the baseline alpha / (alpha + beta))")
        self.__init__(state["steps"], np.array(state["keys"], dtype=str), alpha, beta)


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
