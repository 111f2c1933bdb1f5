"""Study presets: which cells (estimator x G x order) run, with how many seeds, at what scale."""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ebpo_verl.study.policy import PolicyConfig
from ebpo_verl.study.rl import ESTIMATORS, ORDERS, RLConfig
from ebpo_verl.study.tasks import LEVELS

BASE_SEED = 0
"""The seed of the warm start (one "base model" shared by every run) and of the data splits."""
ALL_ESTIMATORS = tuple(ESTIMATORS)
DEFAULT_LR = 3e-4
"""The learning rate of an estimator a preset has no rate for (``--estimators``): the tiny preset's, mid-grid."""
LR_GRID = (7.5e-5, 1.5e-4, 3e-4, 6e-4)
"""Learning rates tried for every estimator. The first tuning run tried (1.5e-4, 3e-4, 6e-4) for the estimators
whose advantages are standardised and (6e-4, 1.2e-3, 2.4e-3) for OTB, whose are not, and each chose its lowest
value (OTB's validation accuracy 0.37, 0.09, 0.003): this grid goes a step lower and holds OTB's best so far."""
LR_TUNING_FILE = Path(__file__).with_name("lr_tuning.json")
"""The tuning run whose chosen learning rates the fixed-lr presets use (``--preset tune`` writes it)."""


def tuned_lrs() -> dict[str, float]:
    """Each estimator's chosen learning rate in :data:`LR_TUNING_FILE` (empty when there is none)."""
    try:
        record = json.loads(LR_TUNING_FILE.read_text())
    except FileNotFoundError:
        return {}
    return {e: float(v["chosen"]) for e, v in record["lr_grid"].items()}


@dataclass(frozen=True)
class Preset:
    """A study grid: the main table crosses ``estimators`` x ``group_sizes`` (random order), the ordering table
    ``order_estimators`` x ``orders`` at G = ``order_group_size``; every cell runs seeds 0..seeds-1. Learning rates:
    with ``tune`` ({"group_sizes": [...], "seeds": n}) every estimator first runs at every rate of ``lr_grid`` at
    those G and seeds on the validation split and the main grid takes each one's best; without, ``lr`` gives them."""

    name: str
    estimators: tuple[str, ...]
    group_sizes: tuple[int, ...]
    seeds: int
    order_estimators: tuple[str, ...]
    order_group_size: int
    orders: tuple[str, ...] = ORDERS
    topics: tuple[str, ...] = ("add", "sub")
    levels: tuple[int, ...] = (2, 3)
    policy: PolicyConfig = PolicyConfig()
    # prompts per (topic, level) cell: validation (lr choice), held-out test, RL training, warm start; every
    # 2- and 3-digit cell has thousands of problems, so each split is an iid draw of the same generator
    split_sizes: dict = field(default_factory=lambda: {"val": 200, "heldout": 200, "train": 400, "sft": 5000})
    sft_steps: int = 800
    misconception: float = 0.8
    rl: dict = field(
        default_factory=lambda: {"steps": 120, "responses_per_step": 128, "eval_every": 10, "grad_clip": 5.0}
    )
    lr: dict = field(default_factory=dict)
    lr_grid: dict = field(default_factory=dict)
    tune: dict | None = None
    target_gain: float = 0.05
    workers: int = 2

    def __post_init__(self):
        unknown = [e for e in (*self.estimators, *self.order_estimators) if e not in ESTIMATORS]
        if unknown:
            raise ValueError(f"preset {self.name}: unknown estimators {unknown}; choose from {ALL_ESTIMATORS}")
        if self.seeds < 2:
            raise ValueError(f"preset {self.name}: seeds={self.seeds}; a 95% interval needs at least 2")
        if any(lv not in LEVELS for lv in self.levels):
            raise ValueError(f"preset {self.name}: levels {self.levels}; choose from {LEVELS}")

    def with_estimators(self, names: tuple[str, ...], lr: float = DEFAULT_LR) -> Preset:
        """This grid with ``names`` as its estimators (the ordering table keeps those among them), one without a rate at
        ``lr`` (a tuning preset: every rate of :data:`LR_GRID`). ValueError for a name the study does not know."""
        rates = {e: self.lr.get(e, lr) for e in names} if self.lr else {}
        order = tuple(e for e in self.order_estimators if e in names)
        grid = dict.fromkeys(names, LR_GRID) if self.tune else {}
        return dataclasses.replace(self, estimators=names, order_estimators=order, lr=rates, lr_grid=grid)

    def cells(self) -> list[tuple[str, int, str]]:
        """(estimator, G, order) of every cell, sorted, without duplicates: the main table and the ordering table."""
        cells = {(e, g, "random") for e in self.estimators for g in self.group_sizes}
        cells |= {(e, self.order_group_size, o) for e in self.order_estimators for o in self.orders}
        return sorted(cells)

    def check_lrs(self) -> None:
        """Raise ValueError naming the estimators without a learning rate (``lr``) or a grid (``lr_grid``)."""
        used = {*self.estimators, *self.order_estimators}
        missing = sorted(used - set(self.lr_grid if self.tune else self.lr))
        if missing:
            what = "lr_grid" if self.tune else f"tuned lr in {LR_TUNING_FILE} (run --preset tune, then copy its file)"
            raise ValueError(f"preset {self.name}: no {what} for {missing}")

    def tuning_runs(self) -> list[RLConfig]:
        """The tuning runs (validation split): every estimator at every ``lr_grid`` rate, each ``tune`` G and seed."""
        ests = sorted({*self.estimators, *self.order_estimators}) if self.tune else []
        return [RLConfig(estimator=e, group_size=g, seed=s, lr=lr, split="validation", **self.rl)
                for e in ests for g in self.tune["group_sizes"] for lr in self.lr_grid[e]
                for s in range(self.tune["seeds"])]  # fmt: skip

    def n_runs(self) -> int:
        return len(self.cells()) * self.seeds + len(self.tuning_runs())

    def fingerprint(self) -> dict:
        """Everything that decides the results, as JSON values (``workers`` does not); a resumed study must match."""
        return json.loads(json.dumps({k: v for k, v in asdict(self).items() if k != "workers"}))


class TunedPlan(ABC):
    """What the plan studies' plans share (rivals2's ``Plan``, the why study's ``WhyPlan``), each a frozen dataclass
    with ``name``, ``scale`` (the preset of its RL runs), tuning seeds from ``tune_seed0`` (``tune_seeds`` of them)
    and ``run_cap``, naming its estimators (:meth:`arms`), its own rules (:meth:`problem`) and its run count."""

    name: str
    scale: Preset
    tune_seed0: int
    tune_seeds: int
    run_cap: int

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms() if a not in ESTIMATORS]
        if unknown:
            raise ValueError(f"plan {self.name}: unknown estimators {unknown}; choose from {sorted(ESTIMATORS)}")
        if problem := self.problem():
            raise ValueError(f"plan {self.name}: {problem}")
        if self.planned_runs() > self.run_cap:
            raise ValueError(f"plan {self.name}: {self.planned_runs()} runs exceed run_cap {self.run_cap}")

    @abstractmethod
    def arms(self) -> tuple[str, ...]:
        """The estimators the plan runs."""

    @abstractmethod
    def problem(self) -> str | None:
        """What breaks the plan's own rules, in words (None: nothing)."""

    @abstractmethod
    def planned_runs(self) -> int:
        """The runs the plan starts with (tuning on its initial grid and every test run)."""

    @property
    def tuning_seeds(self) -> list[int]:
        return list(range(self.tune_seed0, self.tune_seed0 + self.tune_seeds))

    def fingerprint(self) -> dict:
        """The plan as JSON values, its preset's :meth:`Preset.fingerprint` in place; a resumed study must match."""
        return json.loads(
            json.dumps({k: v for k, v in asdict(self).items() if k != "scale"} | {"scale": self.scale.fingerprint()})
        )


QUICK_ESTIMATORS = ("grpo", "ebpo", "otb", "dbb")
FULL_ESTIMATORS = ("grpo", "grpo_bn", "ebpo", "ebpo_batch", "otb", "rloo", "spo", "dbb")
RIVAL_ESTIMATORS = ("grpo", "rloo", "otb", "ebpo", "spo", "dbb", "jspo", "bnpo", "jspo_history", "ha_dw", "krpo",
                    "running_norm")  # fmt: skip
"""Every estimator of the package beside the 2025-2026 rivals (docs/rivals.md); jspo is shrinkage_js."""
_TUNED = tuned_lrs()


def _tuned(name: str, estimators: tuple[str, ...], group_sizes: tuple[int, ...], seeds: int, tune_seeds: int) -> Preset:
    """A main-table grid that tunes its learning rates in the same command (:data:`LR_GRID` at G = 4)."""
    return Preset(
        name=name,
        estimators=estimators,
        group_sizes=group_sizes,
        seeds=seeds,
        order_estimators=(),
        order_group_size=4,
        lr_grid=dict.fromkeys(estimators, LR_GRID),
        tune={"group_sizes": (4,), "seeds": tune_seeds},
    )


PRESETS: dict[str, Preset] = {
    # About a minute: the test suite's end-to-end run (two estimators, two group sizes, two seeds, 8 steps).
    "tiny": Preset(
        name="tiny",
        estimators=("grpo", "ebpo"),
        group_sizes=(4, 8),
        seeds=2,
        order_estimators=("grpo",),
        order_group_size=4,
        orders=("random", "topic"),
        split_sizes={"val": 50, "heldout": 50, "train": 150, "sft": 3000},
        sft_steps=800,
        rl={"steps": 8, "responses_per_step": 64, "eval_every": 4, "grad_clip": 5.0},
        lr={"grpo": 3e-4, "ebpo": 3e-4},
        workers=1,
    ),
    # The quick preset's learning-rate choice on the validation split; writes lr_tuning.json (committed as
    # ebpo_verl/study/lr_tuning.json).
    "tune": _tuned("tune", QUICK_ESTIMATORS, group_sizes=(), seeds=3, tune_seeds=3),
    # The default: each estimator (otb: verl's Optimal Token Baseline) at the rate the tune preset chose.
    "quick": Preset(
        name="quick",
        estimators=QUICK_ESTIMATORS,
        group_sizes=(2, 4, 8),
        seeds=4,
        order_estimators=(),
        order_group_size=4,
        lr={e: _TUNED[e] for e in QUICK_ESTIMATORS if e in _TUNED},
    ),
    # Everything: the eight estimators of the issue (ebpo_batch: EBPO as released), rates tuned in the same command.
    "full": _tuned("full", FULL_ESTIMATORS, group_sizes=(2, 4, 8, 16), seeds=5, tune_seeds=2),
    # The rivals (issue 39, docs/rivals.md), rates tuned in the same command; 128 / G prompts per step (equal samples).
    "rivals": _tuned("rivals", RIVAL_ESTIMATORS, group_sizes=(2, 4, 8), seeds=6, tune_seeds=2),
}

# Wall time of the whole command on 2 otherwise idle cores (torch 2.13 CPU build), for ``--help`` and the README
# (docs/study.md).
DURATION = {
    "tiny": "about 1 min",
    "tune": "about 5.5 min (measured: 5 min 31 s)",
    "quick": "about 5.5-6 min (measured: 5 min 39 s, 596 CPU-seconds)",
    "rivals": "measured: 84 min (5060 s) on cores shared with other sessions' tests; about 35 min idle (estimated)",
    "full": "about 25 min (estimated from the tune run; measured: 66 min on cores shared with other jobs)",
}


def describe_presets() -> str:
    """One line per preset: its size and how long it takes."""
    return "\n".join(
        f"{name}: {len(p.estimators)} estimators x G in {list(p.group_sizes)}, {p.seeds} seeds, {p.rl['steps']} steps"
        + (f" (+ lr grid x G in {list(p.tune['group_sizes'])} x {p.tune['seeds']} seeds)" if p.tune else "")
        + f" -> {p.n_runs()} runs, {DURATION.get(name, 'time not measured')}"
        for name, p in PRESETS.items()
    )
