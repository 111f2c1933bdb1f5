"""Study presets: which cells (estimator x G x order) run, with how many seeds, at what scale."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ebpo_verl.study.policy import PolicyConfig
from ebpo_verl.study.rl import ESTIMATORS, ORDERS
from ebpo_verl.study.tasks import TOPICS

ALL_ESTIMATORS = tuple(ESTIMATORS)


@dataclass(frozen=True)
class Preset:
    """A study grid. The main table crosses ``estimators`` x ``group_sizes`` (random order); the ordering table
    crosses ``order_estimators`` x ``orders`` at G = ``order_group_size``. Every cell runs seeds 0..seeds-1."""

    name: str
    estimators: tuple[str, ...]
    group_sizes: tuple[int, ...]
    seeds: int
    order_estimators: tuple[str, ...]
    order_group_size: int
    orders: tuple[str, ...] = ORDERS
    topics: tuple[str, ...] = TOPICS
    policy: PolicyConfig = PolicyConfig()
    # prompts per (topic, level) cell; a 1-digit cell has fewer distinct problems and gives each split what it
    # can, so 1-digit cells weigh more in the held-out split than in the RL split
    split_sizes: dict = field(default_factory=lambda: {"heldout": 50, "train": 300, "sft": 5000})
    sft_steps: int = 1000
    misconception: float = 0.5
    rl: dict = field(default_factory=lambda: {"steps": 50, "responses_per_step": 128, "lr": 3e-4, "eval_every": 5})
    target_gain: float = 0.03
    workers: int = 2

    def __post_init__(self):
        unknown = [e for e in (*self.estimators, *self.order_estimators) if e not in ESTIMATORS]
        if unknown:
            raise ValueError(f"preset {self.name}: unknown estimators {unknown}; choose from {ALL_ESTIMATORS}")
        if self.seeds < 2:
            raise ValueError(f"preset {self.name}: seeds={self.seeds}; a 95% interval needs at least 2")

    def cells(self) -> list[tuple[str, int, str]]:
        """(estimator, G, order) of every cell, sorted: the main table (random order) and the ordering table,
        without duplicates. Each cell runs seeds 0..seeds-1."""
        cells = {(e, g, "random") for e in self.estimators for g in self.group_sizes}
        cells |= {(e, self.order_group_size, o) for e in self.order_estimators for o in self.orders}
        return sorted(cells)

    def n_runs(self) -> int:
        return len(self.cells()) * self.seeds

    def fingerprint(self) -> dict:
        """Everything that decides the results (``workers`` does not: each run is deterministic for its seed),
        as JSON values; a resumed study must have the same."""
        return json.loads(json.dumps({k: v for k, v in asdict(self).items() if k != "workers"}))


PRESETS: dict[str, Preset] = {
    # About 40 s: the test suite's end-to-end run (two estimators, two group sizes, two seeds, two
    # topics). The warm start is the quick preset's model size on two topics; its RL runs are only 8 steps.
    "tiny": Preset(
        name="tiny",
        estimators=("grpo", "ebpo"),
        group_sizes=(4, 8),
        seeds=2,
        order_estimators=("grpo",),
        order_group_size=4,
        orders=("random", "topic"),
        topics=("add", "sub"),
        split_sizes={"heldout": 50, "train": 300, "sft": 3000},
        sft_steps=800,
        rl={"steps": 8, "responses_per_step": 64, "lr": 3e-4, "eval_every": 4},
        workers=1,
    ),
    # The default: GRPO, GRPO+BN, EBPO, EBPO as released (batch statistics) and verl's Optimal Token Baseline (the
    # strongest small-group competitor) at G in {2, 4, 8, 16}, 5 seeds; the ordering table for grpo and ebpo at
    # G = 4. 120 runs.
    "quick": Preset(
        name="quick",
        estimators=("grpo", "grpo_bn", "ebpo", "ebpo_batch", "otb"),
        group_sizes=(2, 4, 8, 16),
        seeds=5,
        order_estimators=("grpo", "ebpo"),
        order_group_size=4,
    ),
    # Everything: all twelve estimators (the paper's eight plus shrinkage_js, bnpo, spo and otb), G up to 32, 8 seeds,
    # 120 steps, the ordering table for all of them. In 120 steps a run at G >= 8 covers less than one epoch of the
    # RL prompts, so spo's tracker never sees a prompt twice there (study.md reports spo/frac_seen).
    "full": Preset(
        name="full",
        estimators=ALL_ESTIMATORS,
        group_sizes=(2, 4, 8, 16, 32),
        seeds=8,
        order_estimators=ALL_ESTIMATORS,
        order_group_size=4,
        rl={"steps": 120, "responses_per_step": 128, "lr": 3e-4, "eval_every": 5},
        sft_steps=1200,
    ),
}

# Wall time on 2 otherwise idle cores (torch 2.13 CPU build), for ``--help`` and the README. quick: its 100-run form
# (without otb) took 4.3 min idle; the 120 runs took 11.9 min on a machine shared with other jobs, so about 5 min
# idle is an estimate. full: 31 min was measured for its earlier form (448 runs, 8 estimators); 672 runs scale that
# to about 47 min, not measured.
DURATION = {
    "tiny": "about 40 s",
    "quick": "about 5 min (estimated)",
    "full": "about 47 min (estimated; 448 runs took 31 min)",
}


def describe_presets() -> str:
    """One line per preset: its size and how long it takes."""
    return "\n".join(
        f"{name}: {len(p.estimators)} estimators x G in {list(p.group_sizes)}, {p.seeds} seeds, {p.rl['steps']} steps"
        f" -> {p.n_runs()} runs, {DURATION.get(name, 'time not measured')}"
        for name, p in PRESETS.items()
    )
