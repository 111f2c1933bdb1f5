"""The run's options, parsed and validated once per process into one frozen :class:`RunOptions`.

Each options class holds its own defaults and checks (:class:`~ebpo_verl.algos.ebpo.EBPOOptions` for
``algorithm.ebpo``, :class:`~ebpo_verl.algos.baselines.SPOOptions` for ``algorithm.spo``,
:class:`~ebpo_verl.algos.ordering.CurriculumOptions` for ``data.curriculum``), all parsed by
:func:`~ebpo_verl.options.parsing.parse_section`; ``trainer/config/ebpo_trainer.yaml`` repeats the defaults only so that
Hydra accepts the overrides, and ``tests/test_options.py`` checks that it holds exactly the dataclasses' defaults.

Who parses, and how often (``option_parsing.PARSES`` counts it):

- ``ebpo-train``'s driver: :func:`ebpo_verl.trainer.preflight.preflight` builds ``RunOptions.from_config`` once and
  every check reads that object;
- the TaskRunner (another process): ``EBPOTaskRunner.run`` builds it once and passes it to the trainer, which
  creates the run's estimator object with ``RunOptions.estimator`` (``ebpo_verl.trainer.adapter.new_estimator``):
  no parse per step;
- stock ``verl.trainer.main_ppo`` (the estimator sees only the raw ``algorithm`` node):
  :func:`options_for_node` validates each distinct value once per process and reuses the result by value.

:data:`STATEFUL` lists the estimators whose running state lives across steps and in every checkpoint; everything
that differs between them (options class, estimator class, state file, per-row key) is one entry there.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from ebpo_verl.algos.baselines import SPOEstimator, SPOOptions
from ebpo_verl.algos.dbb import DBBEstimator, DBBOptions
from ebpo_verl.algos.ebpo import EBPOOptions, ignored_keys, ignored_options_warning
from ebpo_verl.algos.ebpo_math import EBPOEstimator
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.options.parsing import option_keys, parse_section


def _nothing_ignored(options: Any) -> set[str]:
    return set()


@dataclass(frozen=True)
class StatefulEstimator:
    """An estimator with running state saved in every checkpoint (``global_step_N/<state_file>``).

    name: ``algorithm.adv_estimator``; its options are ``algorithm.<name>``, parsed into ``options_cls``.
    estimator_cls: the :class:`~ebpo_verl.algos.estimator.Estimator` whose ``state`` is saved (``reset``,
        ``state_dict``, ``load_state_dict``).
    label / what: the estimator's name and what starts fresh, in messages.
    row_key: the option naming the ``extra_info`` field the estimator reads per row (None: none); the trainer
        passes it as a per-step uid -> value map. unique_row_key: that field identifies a prompt (unique over
        the training rows; a uid key would change every step); otherwise it is a label shared by prompts.
    mode_keys / ignored: a resume ignores changes of the options ``ignored(options)`` while no mode key changed.
    never_keep: options whose change a resume never continues under ``on_resume_mismatch=keep``.
    """

    name: str
    options_cls: type
    estimator_cls: type
    state_file: str
    label: str
    what: str
    row_key: str | None = None
    unique_row_key: bool = False
    mode_keys: tuple[str, ...] = ()
    ignored: Callable[[Any], set[str]] = _nothing_ignored
    never_keep: tuple[str, ...] = ()

    @property
    def section(self) -> str:
        return f"algorithm.{self.name}"

    @property
    def state_cls(self) -> type:
        return self.estimator_cls.state_cls

    @property
    def option_keys(self) -> tuple[str, ...]:
        return option_keys(self.options_cls)

    @property
    def resume_keys(self) -> tuple[str, ...]:
        """The options a resume compares with the checkpoint's (all but ``on_resume_mismatch`` itself)."""
        return tuple(k for k in self.option_keys if k != "on_resume_mismatch")

    def parse(self, node: Any) -> Any:
        return parse_section(self.options_cls, node, self.section)

    def row_key_of(self, options: Any) -> str | None:
        """The ``extra_info`` field these options make the estimator read per row (None: none)."""
        return getattr(options, self.row_key) if self.row_key else None


EBPO = StatefulEstimator(
    "ebpo",
    EBPOOptions,
    EBPOEstimator,
    "ebpo_state.json",
    "EBPO",
    "empirical-Bayes statistics",
    row_key="cluster_key",
    mode_keys=("stats_scope", "prior", "shrinkage", "norm", "cluster_key"),
    ignored=ignored_keys,
)
SPO = StatefulEstimator(
    "spo",
    SPOOptions,
    SPOEstimator,
    "spo_state.json",
    "SPO",
    "SPO trackers (baseline 0.5)",
    row_key="prompt_key",
    unique_row_key=True,
    never_keep=("prompt_key",),
)
DBB = StatefulEstimator(
    "dbb",
    DBBOptions,
    DBBEstimator,
    "dbb_state.json",
    "DBB",
    "DBB posteriors (prior Beta(prior_alpha, prior_beta))",
    row_key="prompt_key",
    unique_row_key=True,
    never_keep=("prompt_key",),
)
STATEFUL: dict[str, StatefulEstimator] = {e.name: e for e in (EBPO, SPO, DBB)}
"""Every estimator with checkpointed state, by its verl name: the one place a new one is added."""


@dataclass(frozen=True)
class RunOptions:
    """The validated options of one run: the estimator's (``estimator``: the options of its :data:`STATEFUL`
    entry, None for other estimators) and the curriculum's."""

    adv_estimator: str
    estimator: Any = None
    curriculum: CurriculumOptions = field(default_factory=CurriculumOptions)

    @classmethod
    def from_config(cls, config: Any) -> RunOptions:
        """Parse and validate the options of a composed config; any problem -> EBPOConfigError (one line)."""
        from ebpo_verl.trainer.curriculum import validate_curriculum_config

        name = str(config.algorithm.adv_estimator)
        entry = STATEFUL.get(name)
        try:
            estimator = entry.parse(config.algorithm.get(name, None)) if entry else None
            curriculum = validate_curriculum_config(config.data)
        except (TypeError, ValueError) as err:
            raise EBPOConfigError(str(err)) from err
        return cls(name, estimator, curriculum)

    @property
    def stateful(self) -> StatefulEstimator | None:
        return STATEFUL.get(self.adv_estimator)

    @property
    def ebpo(self) -> EBPOOptions | None:
        return self.estimator if self.adv_estimator == EBPO.name else None

    @property
    def spo(self) -> SPOOptions | None:
        return self.estimator if self.adv_estimator == SPO.name else None

    @property
    def row_key(self) -> str | None:
        """The ``extra_info`` field the estimator reads per row (``cluster_key``, ``prompt_key``), or None."""
        entry = self.stateful
        return entry.row_key_of(self.estimator) if entry else None


_BY_VALUE: dict[tuple[str, str], Any] = {}


def options_for_node(entry: StatefulEstimator, node: Any) -> Any:
    """``entry``'s options from a raw ``algorithm.<name>`` node (stock ``main_ppo``): validated the first time this
    process sees these values, then reused by value (an equal node built anew gives the same object). The
    ``ebpo`` options a mode ignores are named in a warning when first validated."""
    key = (entry.name, _canonical(node))
    options = _BY_VALUE.get(key)
    if options is None:
        options = _BY_VALUE[key] = entry.parse(node)
        message = ignored_options_warning(options) if entry is EBPO else None
        if message:
            warnings.warn(f"EBPO: {message}", RuntimeWarning, stacklevel=3)
    return options


def _canonical(node: Any) -> str:
    if OmegaConf.is_config(node):
        node = OmegaConf.to_container(node, resolve=True)
    if isinstance(node, Mapping):
        node = dict(node)
    return json.dumps(node, sort_keys=True, default=repr)
