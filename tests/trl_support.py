"""What tests/test_trl.py (the TRL integration, [trl] extra only) and tests/test_trl_verl.py (its comparisons with
verl) share: TRL's GRPOTrainer on the package's tiny model, recording the advantages that reach the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from ebpo_verl.algos import registry
from ebpo_verl.cpu.tiny import build_model, build_tokenizer
from ebpo_verl.integrations.trl import EstimatorMixin

ROWS = 8
FAILING = {0, 1}  # prompts whose every completion scores 0: the all-fail groups of step 1


def reward(completions: list[str], extra_info: list[dict] | None = None, **kwargs: object) -> list[float]:
    """0 for the FAILING prompts, else a parity of the completion's characters (varied, deterministic)."""
    pairs = zip(completions, extra_info or [{"index": 0}] * len(completions), strict=True)
    return [0.0 if e["index"] in FAILING else float(sum(map(ord, c)) % 2) for c, e in pairs]


class Spy(GRPOTrainer):
    """Records TRL's own advantages of each generation (before the mixin replaces them)."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.trl_advantages.append(output["advantages"].clone())
        return output


class Recorded(EstimatorMixin, Spy):
    """The integration, recording each step's gathered rewards, keys and the advantages that reach the loss."""

    def __init__(self, *args, **kwargs):
        self.trl_advantages, self.steps, self.used, self.micro = [], [], [], []
        super().__init__(*args, **kwargs)

    def estimate(self, rewards_per_func, keys, train):
        values = super().estimate(rewards_per_func, keys, train)
        if train:
            self.steps.append((rewards_per_func.clone(), None if keys is None else keys.copy()))
        return values

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.used.append(output["advantages"].clone())
        return output

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:  # the slice of the block each training micro-step takes to the loss
            self.micro.append(inputs["advantages"].clone())
        return inputs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer(path)
    build_model(path, tokenizer)
    return path, tokenizer


def dataset(rows: int = ROWS) -> Dataset:
    return Dataset.from_list([{"prompt": f"What is {i} + 1?", "extra_info": {"index": i}} for i in range(rows)])


def trainer(tiny, out: Path, estimator: str, options=None, steps: int = 2, cls=Recorded, rows: int = ROWS, **config):
    path, tokenizer = tiny
    settings = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=6, max_steps=steps)
    settings.update(report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, seed=0)
    settings.update(config)
    args = GRPOConfig(output_dir=str(out), **settings)
    kw = {} if cls is Spy else {"estimator": estimator, "estimator_options": options}
    data = dataset(rows)
    return cls(model=str(path), reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, **kw)


VERL_OVERRIDES = {"krpo": {"order": "rows"}}
"""Stock verl passes no rollout sample index, so its ``krpo`` walks the rows as given; TRL's ``krpo`` runs with its
defaults (each completion's place in its group, the same walk): equal, as the test below checks."""


def options_of(name: str, verl: bool = False) -> dict | None:
    """The options a test runs ``name`` with: a prompt key where the estimator tracks prompts (``extra_info.index``),
    with ``verl`` the VERL_OVERRIDES; None (the defaults) otherwise."""
    spec = registry.get(name)
    options = {spec.row_key: "extra_info.index"} if spec.unique_row_key else {}
    options.update(VERL_OVERRIDES.get(name, {}) if verl else {})
    return options or None


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """``runs(name)``: a 2-step run of ``name`` (checkpoints 1 and 2 for a stateful one), trained once per module."""
    done: dict[str, GRPOTrainer] = {}

    def run(name: str) -> GRPOTrainer:
        if name not in done:
            save = {"save_strategy": "steps", "save_steps": 1} if registry.get(name).stateful else {}
            done[name] = trainer(tiny, tmp_path_factory.mktemp(name), name, options_of(name), steps=2, **save)
            done[name].train()
        return done[name]

    return run
