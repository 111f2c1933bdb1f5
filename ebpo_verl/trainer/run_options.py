"""The run's options, parsed and validated once per process into one frozen :class:`RunOptions`.

Each options section is one dataclass declaring its options once (:class:`~ebpo_verl.options.parsing.OptionSection`:
:class:`~ebpo_verl.algos.ebpo.EBPOOptions` for ``algorithm.ebpo``, :class:`~ebpo_verl.algos.baselines.SPOOptions`,
:class:`~ebpo_verl.algos.dbb.DBBOptions`, :class:`~ebpo_verl.algos.ordering.CurriculumOptions` for
``data.curriculum``, :class:`TrainerOptions` for our keys of ``trainer``); ``trainer/config/ebpo_trainer.yaml`` is
generated from them (:mod:`ebpo_verl.trainer.config.generate`; ``tests/test_options.py`` keeps it equal).

Who parses, and how often (``tests/test_options.py`` counts it):

- ``ebpo-train``'s driver: :func:`ebpo_verl.trainer.preflight.preflight` builds ``RunOptions.from_config`` once and
  every check reads that object;
- the TaskRunner (another process): ``EBPOTaskRunner.run`` builds it once and passes it to the trainer, which
  creates the run's estimator object with ``RunOptions.estimator`` (``ebpo_verl.trainer.adapter.new_estimator``):
  no parse per step;
- stock ``verl.trainer.main_ppo`` (the estimator sees only the raw ``algorithm`` node):
  :func:`options_for_node` validates the node's value when it first sees it or it changes, and otherwise reuses
  the result.

:data:`STATEFUL` lists the estimators whose running state lives across steps and in every checkpoint; everything
that differs between them (options class, estimator class, state file, per-row key) is one entry there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import OmegaConf

from ebpo_verl.algos.baselines import SPOEstimator, SPOOptions
from ebpo_verl.algos.dbb import DBBEstimator, DBBOptions
from ebpo_verl.algos.ebpo import EBPOOptions, ignored_keys, ignored_options_warning
from ebpo_verl.algos.ebpo_math import EBPOEstimator
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.options.parsing import OptionSection, Rule, is_real, option


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
        return self.options_cls.keys()

    @property
    def resume_keys(self) -> tuple[str, ...]:
        """The options a resume compares with the checkpoint's (all but ``on_resume_mismatch`` itself)."""
        return tuple(k for k in self.option_keys if k != "on_resume_mismatch")

    def parse(self, node: Any) -> Any:
        return self.options_cls.from_mapping(node)

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


STEP_TIMEOUT_ENV = "EBPO_STEP_TIMEOUT_S"
INIT_TIMEOUT_ENV = "EBPO_INIT_TIMEOUT_S"
"""Environment variable that overrides ``trainer.step_timeout_s`` (read in the driver; the driver writes the
resolved value into the config for the Ray workers, which lack the variable)."""


@dataclass(frozen=True)
class TrainerOptions(OptionSection):
    """The keys this package adds to verl's ``trainer`` section (the rest of ``trainer`` is verl's)."""

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
        rule=Rule(is_real, "a number of seconds (0: no watchdog)"),
    )

    init_timeout_s: float | None = option(
        3600,
        "the same for model initialisation, the checkpoint load and the agent loop's start (the watchdog's init "
        f"phases); env {INIT_TIMEOUT_ENV} overrides; 0 or null: off",
        choices=(None,),
        rule=Rule(is_real, "a number of seconds (0: not watched)"),
    )
    trust_checkpoint: bool = option(
        False,
        "a resume unpickles the checkpoint's files as verl does (weights_only=False), running any code they carry; "
        "false: tensors and the types of this package's own checkpoints only, anything else refused in one line "
        "(docs/training.md#trust)",
        choices=(True, False),
    )

    ENV: ClassVar[dict[str, str]] = {"step_timeout_s": STEP_TIMEOUT_ENV, "init_timeout_s": INIT_TIMEOUT_ENV}
    """The environment variables that replace a key when set."""

    @classmethod
    def from_trainer(cls, trainer: Any, env: Mapping[str, str] | None = None) -> TrainerOptions:
        """Our keys of a composed ``trainer`` node (absent keys: the defaults), each variable of :data:`ENV` set
        in ``env`` (default: this process's) replacing its key; ValueError naming the key or the variable."""
        options = cls.from_mapping({key: trainer[key] for key in cls.keys() if key in trainer})
        env = os.environ if env is None else env
        replaced: dict[str, float] = {}
        for key, variable in cls.ENV.items():
            raw = env.get(variable, "").strip()
            if not raw:
                continue
            try:
                replaced[key] = float(raw)
            except ValueError:
                raise ValueError(
                    f"{variable}={raw!r} is not a number of seconds: set it to e.g. 3600, or 0 to disable"
                ) from None
        return dataclasses.replace(options, **replaced) if replaced else options

    @staticmethod
    def _seconds(value: float | None) -> float | None:
        return float(value) if value is not None and value > 0 else None

    @property
    def watchdog_timeout_s(self) -> float | None:
        """Seconds without progress before the watchdog stops the run; None (no watchdog) for 0, negative, null."""
        return self._seconds(self.step_timeout_s)

    @property
    def watchdog_init_timeout_s(self) -> float | None:
        """The same for the init phases."""
        return self._seconds(self.init_timeout_s)


@dataclass(frozen=True)
class RunOptions:
    """The validated options of one run: the estimator's (``estimator``: the options of its :data:`STATEFUL`
    entry, None for other estimators), the curriculum's and our ``trainer`` keys."""

    adv_estimator: str
    estimator: Any = None
    curriculum: CurriculumOptions = field(default_factory=CurriculumOptions)
    trainer: TrainerOptions = field(default_factory=TrainerOptions)

    @classmethod
    def from_config(cls, config: Any) -> RunOptions:
        """Parse and validate the options of a composed config; any problem -> EBPOConfigError (one line)."""
        from ebpo_verl.trainer.curriculum import validate_curriculum_config

        name = str(config.algorithm.adv_estimator)
        try:  # every estimator section present is checked (a typo there is refused); the run's is kept
            parsed = {key: e.parse(config.algorithm[key]) for key, e in STATEFUL.items() if key in config.algorithm}
            estimator = (parsed[name] if name in parsed else STATEFUL[name].parse(None)) if name in STATEFUL else None
            curriculum = validate_curriculum_config(config.data)
            trainer = TrainerOptions.from_trainer(config.trainer)
        except (TypeError, ValueError) as err:
            raise EBPOConfigError(str(err)) from err
        return cls(name, estimator, curriculum, trainer)

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


_LAST: dict[str, tuple[str, Any]] = {}
"""Estimator name -> (the last node value its options came from, those options): one entry per estimator."""


def options_for_node(entry: StatefulEstimator, node: Any) -> Any:
    """``entry``'s options from a raw ``algorithm.<name>`` node (stock ``main_ppo``): validated when this process
    first sees the node and whenever its value changes, otherwise reused (an equal node built anew gives the same
    object). The ``ebpo`` options a mode ignores are named in a warning when validated."""
    value = _canonical(node)
    last = _LAST.get(entry.name)
    if last is not None and last[0] == value:
        return last[1]
    options = entry.parse(node)
    _LAST[entry.name] = (value, options)
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
