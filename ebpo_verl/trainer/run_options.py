"""The run's options, parsed and validated once per process into one frozen :class:`RunOptions`.

Each section is one :class:`~ebpo_verl.options.parsing.OptionSection` (``algorithm.<name>`` per registry entry,
``data.curriculum``, :class:`TrainerOptions`); ``trainer/config/ebpo_trainer.yaml`` is generated from them
(:mod:`ebpo_verl.trainer.config.generate`). The driver's preflight and ``EBPOTaskRunner.run`` each build it once
(no parse per step); under stock ``verl.trainer.main_ppo`` :func:`options_for_node` caches per ``algorithm`` node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import OmegaConf

from ebpo_verl.algos import registry
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.options.parsing import OptionSection, Rule, option, reals

STEP_TIMEOUT_ENV = "EBPO_STEP_TIMEOUT_S"
INIT_TIMEOUT_ENV = "EBPO_INIT_TIMEOUT_S"
"""Environment variables that override ``trainer.step_timeout_s`` / ``trainer.init_timeout_s`` (read in the
driver; the driver writes the resolved values into the config for the Ray workers, which lack the variables)."""
SECONDS = Rule(reals(0).test, "a number of seconds >= 0 (0: off)")
"""A watchdog timeout: 0 turns it off; a negative number is refused (it would turn it off too, silently)."""


@dataclass(frozen=True)
class TrainerOptions(OptionSection):
    """The keys this package adds to verl's ``trainer`` section (the rest of ``trainer`` is verl's). An absent key
    is its declared default, in the driver and in every worker alike."""

    SECTION: ClassVar[str] = "trainer"

    metrics_log_path: str | None = option(
        "${trainer.default_local_dir}/metrics.jsonl",
        "append-only copy of every logged metrics line ({step, data} per line), kept across resumes (verl's file "
        "logger truncates its file on restart); null disables it",
        choices=(None,),
        rule=Rule(lambda x: isinstance(x, str), "a file path"),
    )
    step_timeout_s: float | None = option(
        3600,
        "step watchdog (ebpo_verl.trainer.watchdog): seconds without any phase of a step (rollout, old log-prob, "
        "update, save, weight sync, validation) starting or ending before the run is stopped, naming the actors "
        f"that did not answer; sized for an 8B step on 32 GPUs with long responses; env {STEP_TIMEOUT_ENV} "
        "overrides; 0 or null: off",
        choices=(None,),
        rule=SECONDS,
    )

    init_timeout_s: float | None = option(
        3600,
        "the same for model initialisation, the checkpoint load and the agent loop's start (the watchdog's init "
        f"phases); env {INIT_TIMEOUT_ENV} overrides; 0 or null: off",
        choices=(None,),
        rule=SECONDS,
    )
    trust_checkpoint: bool = option(
        False,
        "a resume unpickles the checkpoint's files as verl does (weights_only=False), running any code they carry; "
        "false: tensors and the types of this package's own checkpoints only, anything else refused in one line "
        "(docs/training.md#trust)",
        choices=(True, False),
    )

    ENV: ClassVar[dict[str, str]] = {"step_timeout_s": STEP_TIMEOUT_ENV, "init_timeout_s": INIT_TIMEOUT_ENV}

    @classmethod
    def from_trainer(cls, trainer: Any, env: Mapping[str, str] | None = None) -> TrainerOptions:
        """Our keys of a composed ``trainer`` node (absent keys: the defaults), each variable of :attr:`ENV` set
        in ``env`` (default: this process's) replacing its key; ValueError naming the key or the variable."""
        options = cls.from_mapping({key: trainer[key] for key in cls.keys() if key in trainer})
        return options.with_env(os.environ if env is None else env)

    @property
    def watchdog_timeout_s(self) -> float | None:
        """Seconds without progress before the watchdog stops the run; None (no watchdog) for 0 or null."""
        return float(self.step_timeout_s) if self.step_timeout_s else None


@dataclass(frozen=True)
class RunOptions:
    """The validated options of one run: the estimator's (``estimator``: the options section of its registry entry,
    None for an estimator without one), the curriculum's and our ``trainer`` keys."""

    adv_estimator: str
    estimator: Any = None
    curriculum: CurriculumOptions = field(default_factory=CurriculumOptions)
    trainer: TrainerOptions = field(default_factory=TrainerOptions)

    @classmethod
    def from_config(cls, config: Any) -> RunOptions:
        """Parse and validate the options of a composed config; any problem -> EBPOConfigError (one line)."""
        from ebpo_verl.trainer.curriculum import validate_curriculum_config

        name = str(config.algorithm.adv_estimator)
        sections = {key: spec for key, spec in registry.ours().items() if spec.options_cls is not None}
        try:  # every estimator section present is checked (a typo there is refused); the run's is kept
            parsed = {
                key: spec.parse(config.algorithm[key]) for key, spec in sections.items() if key in config.algorithm
            }
            estimator = (parsed[name] if name in parsed else sections[name].parse(None)) if name in sections else None
            curriculum = validate_curriculum_config(config.data)
            trainer = TrainerOptions.from_trainer(config.trainer)
        except (TypeError, ValueError) as err:
            raise EBPOConfigError(str(err)) from err
        return cls(name, estimator, curriculum, trainer)

    @property
    def spec(self) -> EstimatorSpec | None:
        """The run's estimator when it is one of ours (None: verl's own)."""
        return registry.ours().get(self.adv_estimator)

    @property
    def stateful(self) -> EstimatorSpec | None:
        """The run's estimator when its state is saved in every checkpoint."""
        return spec if (spec := self.spec) is not None and spec.stateful else None

    @property
    def row_key(self) -> str | None:
        """The ``extra_info`` field the estimator reads per row (the value of its spec's ``row_option``), or None."""
        return spec.row_key_of(self.estimator) if (spec := self.spec) else None


_LAST: dict[str, tuple[str, Any]] = {}
"""Estimator name -> (the last node value its options came from, those options): one entry per estimator. Module
state because stock ``main_ppo`` calls the registered functions with its raw node each step and hands them nothing
that outlives the call (``ebpo-train``, TRL and the study hold their options in their own objects)."""


def options_for_node(entry: EstimatorSpec, node: Any) -> Any:
    """``entry``'s options from a raw ``algorithm.<name>`` node (stock ``main_ppo``): validated when this process
    first sees the node and whenever its value changes, otherwise reused (an equal node built anew gives the same
    object). The options the estimator's mode ignores (``entry.warning``) are named in a warning when validated."""
    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    value = json.dumps(dict(plain) if isinstance(plain, Mapping) else plain, sort_keys=True, default=repr)
    last = _LAST.get(entry.name)
    if last is not None and last[0] == value:
        return last[1]
    options = entry.parse(node)
    _LAST[entry.name] = (value, options)
    entry.warn_ignored(options, stacklevel=3)
    return options
