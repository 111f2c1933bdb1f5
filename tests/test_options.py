"""The options boundary: one source of defaults (the package yaml holds exactly the dataclasses' defaults), one
registry of stateful estimators, one unknown-key message, and how often the options are parsed (counted by
``ebpo_verl.options.parsing.PARSES``): once in the driver's pre-flight, once in the TaskRunner, never per step."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.protocol import DataProto

import ebpo_verl
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.main import PREFIXES, check_overrides
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.options.parsing import PARSES
from ebpo_verl.trainer.adapter import ESTIMATORS
from ebpo_verl.trainer.run_options import STATEFUL, RunOptions

CONFIG_DIR = str(Path(ebpo_verl.__file__).parent / "trainer" / "config")


def _config(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ebpo_trainer", overrides=list(overrides))


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_the_yaml_holds_exactly_the_dataclass_defaults(name):
    """Every option of every stateful estimator, in declaration order, with the dataclass's default and type."""
    entry = STATEFUL[name]
    section = OmegaConf.to_container(_config().algorithm[name])
    defaults = dataclasses.asdict(entry.options_cls())
    assert list(section) == list(defaults)
    assert section == defaults
    assert [type(v) for v in section.values()] == [type(v) for v in defaults.values()]
    assert RunOptions.from_config(_config(f"algorithm.adv_estimator={name}")).estimator == entry.options_cls()


def test_every_stateful_estimator_is_registered_checked_and_checkpointed():
    files = [entry.state_file for entry in STATEFUL.values()]
    assert len(set(files)) == len(files)
    for name, entry in STATEFUL.items():
        assert name in ESTIMATORS and PREFIXES[f"algorithm.{name}."] == entry.option_keys
        assert entry.row_key is None or entry.row_key in entry.option_keys
        assert "on_resume_mismatch" in entry.option_keys and "on_resume_mismatch" not in entry.resume_keys
        state = entry.state_cls()
        state.load_state_dict(state.state_dict())


def test_one_unknown_key_message_for_the_curriculum_too():
    message = "unknown option data.curriculum.ordr; did you mean data.curriculum.order? valid keys: order, align"
    with pytest.raises(ValueError, match=re.escape(message)):
        CurriculumOptions.from_mapping({"ordr": "topic"})
    with pytest.raises(EBPOConfigError, match=re.escape("unknown option algorithm.spo.rhoo; did you mean")):
        check_overrides(["algorithm.adv_estimator=spo", "algorithm.spo.rhoo=0.5"])


def _rows() -> DataProto:
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [0.0]])
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(6, 1)},
        non_tensors={"uid": np.array(["a", "a", "b", "b", "c", "c"], dtype=object)},
    )


def test_parses_before_the_first_step_and_per_step(tmp_path):
    """The driver's pre-flight parses ``algorithm.ebpo`` and ``data.curriculum`` once each; the TaskRunner's
    process parses them once and hands the trainer the object; the estimator, called per step inside the
    trainer's step inputs, parses nothing."""
    from ebpo_verl.trainer.preflight import preflight
    from ebpo_verl.trainer.ray_trainer import ebpo_trainer_cls

    config = _config("algorithm.ebpo.cluster_key=topic", f"trainer.default_local_dir={tmp_path}")
    before = PARSES.copy()
    preflight(config, dry_run=True)
    assert PARSES - before == {"algorithm.ebpo": 1, "data.curriculum": 1}  # the driver, before the first step

    before = PARSES.copy()
    options = RunOptions.from_config(config)  # EBPOTaskRunner.preflight, in the TaskRunner's process
    trainer = functools.partial(ebpo_trainer_cls("sync"), options=options)(config=config)  # as verl's run calls it
    assert trainer.options is options
    assert PARSES - before == {"algorithm.ebpo": 1, "data.curriculum": 1}

    before = PARSES.copy()
    labels = {"a": "x", "b": "x", "c": "y"}
    for _ in range(3):  # three steps
        trainer.estimate_advantages(_rows(), labels, {})
    assert PARSES == before
    assert set(trainer.estimator.state.clusters) == {"x", "y"}  # the step's uid -> label map reached the estimator
    assert trainer.estimator.state.steps == 3
