"""The options boundary: one declaration per option (type, default, allowed values, help) from which the Hydra
config, the checks, the unknown-key messages, ``--help`` and the README table are derived; one registry of
stateful estimators; how often the options are parsed (counted by wrapping ``OptionSection.from_mapping``): once in
the driver's pre-flight, once in the TaskRunner, never per step."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from dataclasses import MISSING
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from verl.protocol import DataProto

from ebpo_verl.algos.baselines import SPOOptions
from ebpo_verl.algos.dbb import DBBOptions
from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.algos.registry import stateful
from ebpo_verl.ops.readme_block import replace_marked_block
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import PATH, OptionSection, accepts, ints, nullable, option
from ebpo_verl.reward import RewardOptions
from ebpo_verl.trainer.adapter import ESTIMATORS, advantage_step
from ebpo_verl.trainer.config.generate import (
    ALL_SECTIONS,
    ESTIMATOR_SECTIONS,
    SECTIONS,
    VERL_DEFAULTS,
    config_yaml,
    options_table,
    shown_in_full,
)
from ebpo_verl.trainer.run_options import RunOptions, TrainerOptions

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_config_file_is_the_generated_one(config_dir):
    """``ebpo_trainer.yaml`` is exactly what the declarations generate (regenerate: python -m ebpo_verl.docs_tables)."""
    assert (config_dir / "ebpo_trainer.yaml").read_text() == config_yaml()


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.SECTION)
def test_the_composed_config_holds_exactly_the_declared_defaults(cls, compose_config):
    """Every option of every section in the config, in declaration order, with the declared default and type."""
    section = OmegaConf.to_container(OmegaConf.select(compose_config(), cls.SECTION), resolve=False)
    section = {k: v for k, v in section.items() if k in cls.keys() or cls is not TrainerOptions}
    defaults = cls.defaults()
    assert list(section) == list(defaults) and section == defaults
    assert [type(v) for v in section.values()] == [type(v) for v in defaults.values()]


def test_the_verl_defaults_we_change_are_in_the_config(compose_config):
    config = compose_config()
    for default in VERL_DEFAULTS:
        assert OmegaConf.select(config, default.key) == default.value, default.key
    trainer = TrainerOptions(f"{config.trainer.default_local_dir}/metrics.jsonl")  # the interpolation, resolved
    assert RunOptions.from_config(config) == RunOptions("ebpo", EBPOOptions(), CurriculumOptions(), trainer)


@pytest.mark.parametrize("cls", ALL_SECTIONS, ids=lambda c: c.SECTION)
def test_each_declaration_has_help_and_accepts_its_default(cls):
    for f in cls.declarations():
        assert len(f.metadata["help"]) > 10, f.name
        assert accepts(f, f.default), f.name
        for choice in f.metadata["choices"]:
            assert accepts(f, choice)
    assert cls() == cls.from_mapping(None) == cls.from_mapping({})


INVALID = [
    (
        CurriculumOptions,
        {"order": "x"},
        "data.curriculum.order='x' is invalid; use native, random, topic or difficulty",
    ),
    (CurriculumOptions, {"seed": -1}, "data.curriculum.seed=-1 is invalid; use null or an integer >= 0"),
    (CurriculumOptions, {"align": True}, "data.curriculum.align and data.curriculum.block_size apply only to order="),
    (EBPOOptions, {"shrinkage": 2}, "algorithm.ebpo.shrinkage=2 is invalid; use auto or a float in [0, 1]"),
    (EBPOOptions, {"cluster_key": ""}, "algorithm.ebpo.cluster_key='' is invalid; use null or a label name"),
    (EBPOOptions, {"min_cluster_prompts": True}, "algorithm.ebpo.min_cluster_prompts=True is invalid; use an integer"),
    (SPOOptions, {"rho": 1}, "algorithm.spo.rho=1 is invalid; use a float in (0, 1)"),
    (DBBOptions, {"normalize": 1}, "algorithm.dbb.normalize=1 is invalid; use true or false"),
    (TrainerOptions, {"step_timeout_s": "abc"}, "trainer.step_timeout_s='abc' is invalid; use null or a number of"),
]


@pytest.mark.parametrize(("cls", "values", "message"), INVALID, ids=lambda x: str(x)[:30])
def test_an_invalid_value_raises_whichever_way_the_options_are_built(cls, values, message):
    """The constructor, ``dataclasses.replace`` and ``from_mapping`` (a dict or an OmegaConf node) all check."""
    builds = (
        lambda: cls(**values),
        lambda: dataclasses.replace(cls(), **values),
        lambda: cls.from_mapping(values),
        lambda: cls.from_mapping(OmegaConf.create(values)),
    )
    for build in builds:
        with pytest.raises(ValueError, match=re.escape(message)):
            build()


def test_one_unknown_key_message_for_every_section():
    for cls in ALL_SECTIONS:
        first = cls.keys()[0]
        message = f"unknown option {cls.SECTION}.{first}x; did you mean {cls.SECTION}.{first}? valid keys: "
        with pytest.raises(ValueError, match=re.escape(message + ", ".join(cls.keys()))):
            cls.from_mapping({f"{first}x": 1})
    with pytest.raises(ValueError, match=re.escape("algorithm.ebpo=5 is not a mapping of options")):
        EBPOOptions.from_mapping(5)


@dataclasses.dataclass(frozen=True)
class _Command(OptionSection):
    """A command line of every kind of declaration: a positional word of a list, a positional path, an option."""

    SECTION: ClassVar[str] = "command"

    what: str = option("run", "what to do", choices=("run", "report"), flag="what")
    folder: str = option(MISSING, "the folder", rule=PATH, flag="FOLDER")
    steps: int | None = nullable("steps; null: all", ints(1))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.what == "report" and self.steps is not None:
            raise ValueError("report reads every step: leave --steps out")


def test_a_command_line_is_parsed_once_into_its_declaration(capsys):
    """``parse`` gives the options object itself, positional arguments included; a word not in the list is
    argparse's own refusal (the list shown as ``{run,report}``), a check between options the parser's one line."""
    assert parse(_Command, "cmd", ["report", "/tmp/x"]) == _Command(what="report", folder="/tmp/x")
    assert parse(_Command, "cmd", ["/tmp/x", "--steps", "3"]) == _Command(folder="/tmp/x", steps=3)
    for argv, says in [
        (["walk", "/tmp/x"], "cmd: error: argument what: invalid choice: 'walk' (choose from 'run', 'report')"),
        (["report", "/tmp/x", "--steps", "3"], "cmd: error: report reads every step: leave --steps out"),
        (["/tmp/x", "--steps", "0"], "cmd: error: argument --steps: '0' is invalid; use null or a positive integer"),
    ]:
        with pytest.raises(SystemExit) as stop:
            parse(_Command, "cmd", argv)
        assert stop.value.code == 2 and capsys.readouterr().err == says + "\n"
    with pytest.raises(SystemExit):
        parse(_Command, "cmd", ["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "usage: cmd [-h] [--steps STEPS] [{run,report}] FOLDER" in shown
    assert "{run,report} what to do FOLDER the folder (required; a path)" in shown


def test_the_readme_table_is_the_generated_one():
    """README.md's options table is what ``python -m ebpo_verl.docs_tables`` writes."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert replace_marked_block(readme, "options", options_table()) == readme
    rows = options_table().splitlines()[2:]
    full = [cls for cls in ALL_SECTIONS if shown_in_full(cls)]
    assert [cls.SECTION for cls in full] == ["algorithm.ebpo", "data.curriculum", "trainer"]
    assert len(rows) == len(full) + 1  # the other estimators: one row naming each, their tables in baselines.md
    for cls, row in zip(full, [rows[0], *rows[2:]], strict=True):
        assert row.startswith(f"| `{cls.SECTION}` |") and row.count("=") == len(cls.keys())
    others = [cls.SECTION.removeprefix("algorithm.") for cls in ALL_SECTIONS if not shown_in_full(cls)]
    assert len(others) == len(ALL_SECTIONS) - 3 and all(f"`{name}`" in rows[1] for name in others)
    assert "`shrinkage=auto`" in rows[0] and "`cluster_key=null`" in rows[0]


def test_the_yaml_values_load_as_declared():
    """The generated scalars read back as the declared defaults (1e-06 a float, null None, the interpolation)."""
    loaded = yaml.safe_load(config_yaml())
    assert loaded["algorithm"]["ebpo"]["epsilon"] == 1e-6 and loaded["algorithm"]["ebpo"]["cluster_key"] is None
    assert loaded["trainer"]["metrics_log_path"] == "${trainer.default_local_dir}/metrics.jsonl"
    assert loaded["defaults"] == ["ppo_trainer", "_self_"]


def test_every_stateful_estimator_is_registered_checked_and_checkpointed():
    files = [entry.state.file for entry in stateful().values()]
    assert len(set(files)) == len(files)
    for name, entry in stateful().items():
        assert name in ESTIMATORS and entry.section == entry.options_cls.SECTION
        assert entry.row_key is None or entry.row_key in entry.option_keys
        assert "on_resume_mismatch" in entry.option_keys and "on_resume_mismatch" not in entry.resume_keys
        state = entry.state_cls()
        state.load_state_dict(state.state_dict())


def test_step_timeout_is_a_run_option(compose_config, monkeypatch):
    monkeypatch.delenv("EBPO_STEP_TIMEOUT_S", raising=False)
    assert RunOptions.from_config(compose_config()).trainer.watchdog_timeout_s == 3600.0
    assert RunOptions.from_config(compose_config("trainer.step_timeout_s=0")).trainer.watchdog_timeout_s is None
    monkeypatch.setenv("EBPO_STEP_TIMEOUT_S", "90")
    assert RunOptions.from_config(compose_config()).trainer.watchdog_timeout_s == 90.0


def _rows() -> DataProto:
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [0.0]])
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(6, 1)},
        non_tensors={"uid": np.array(["a", "a", "b", "b", "c", "c"], dtype=object)},
    )


PER_PROCESS = {**{cls.SECTION: 1 for cls in ESTIMATOR_SECTIONS}, "data.curriculum": 1, "trainer": 1}
"""Every estimator's options section (the registry's), the curriculum's and the trainer's, each parsed once."""


@pytest.fixture
def parses(monkeypatch) -> Counter:
    """Section -> how many times :meth:`OptionSection.from_mapping` parsed it during the test."""
    counts: Counter = Counter()
    parse = OptionSection.from_mapping.__func__

    def counted(cls, mapping):
        counts[cls.SECTION] += 1
        return parse(cls, mapping)

    monkeypatch.setattr(OptionSection, "from_mapping", classmethod(counted))
    return counts


def test_parses_before_the_first_step_and_per_step(tmp_path, compose_config, parses):
    """The driver's pre-flight parses each section once; the TaskRunner's process parses them once and hands the
    trainer the object; the estimator, called per step inside the trainer's step inputs, parses nothing."""
    from ebpo_verl.trainer.preflight import preflight
    from ebpo_verl.trainer.ray_trainer import ebpo_trainer_cls

    model = "actor_rollout_ref.model.path=Qwen/Qwen3-8B"  # a hub id: the pre-flight does not look it up
    config = compose_config("algorithm.ebpo.cluster_key=topic", f"trainer.default_local_dir={tmp_path}", model)
    preflight(config, dry_run=True)
    assert parses == {**PER_PROCESS, RewardOptions.SECTION: 1}  # the driver, before the first step (+ the reward's)

    parses.clear()
    options = RunOptions.from_config(config)  # EBPOTaskRunner.preflight, in the TaskRunner's process
    trainer = functools.partial(ebpo_trainer_cls("sync"), options=options)(config=config)  # as verl's run calls it
    assert trainer.options is options
    assert parses == PER_PROCESS

    parses.clear()
    labels = np.array(["x", "x", "x", "x", "y", "y"], dtype=object)  # per row: uids a, b -> x; c -> y
    for _ in range(3):  # three steps
        advantage_step(_rows(), trainer.estimator, labels)
    assert not parses
    assert set(trainer.estimator.state.clusters) == {"x", "y"}  # the step's per-row labels reached the estimator
    assert trainer.estimator.state.steps == 3
