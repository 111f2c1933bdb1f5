"""The one estimator registry: every advantage estimator the package knows, each declared once beside its math.

An estimator module (``ebpo_verl.algos.<name>``) ends with ``SPECS = (EstimatorSpec(...), ...)``: its verl name,
one-line summary and source, options section, estimator class or pure function, and (when it keeps state
across steps) its checkpoint file and per-row key. :data:`MODULES` lists those modules: adding an estimator is
one new module plus one line there (or, out of tree, an entry point of group :data:`ENTRY_POINT_GROUP` naming a
module with ``SPECS``). Everything else (verl registration, the stateful set, the options sections, the generated
YAML, ``--help``, docs tables, the study's and the recipes' lists, the benchmark) reads :func:`estimators`; in tree,
``python -m ebpo_verl.trainer.config.generate`` (and ``--readme README.md``, ``--docs docs``) then rewrites the
generated files (tests/test_options.py and tests/test_registry.py fail until it has). An entry-point estimator's
options are not in the committed YAML: ``ebpo-train`` sets them with ``++algorithm.<name>.<key>=...``.

Imports neither verl nor Ray: the TRL integration reads it too.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from ebpo_verl.algos.estimator import Advantages, Estimator

MODULES: tuple[str, ...] = (
    "ebpo_verl.algos.verl_builtin",
    "ebpo_verl.algos.ebpo_math",
    "ebpo_verl.algos.baselines",
    "ebpo_verl.algos.dbb",
    "ebpo_verl.algos.jspo",
    "ebpo_verl.algos.jspo_history",
    "ebpo_verl.algos.ha_dw",
    "ebpo_verl.algos.krpo",
    "ebpo_verl.algos.running_norm",
)
"""The modules whose ``SPECS`` make the registry, in the order lists show them: add a new estimator's here."""

ENTRY_POINT_GROUP = "ebpo_verl.estimators"
"""Installed packages add estimators by an entry point of this group naming a module that defines ``SPECS``."""


def _nothing_ignored(options: Any) -> set[str]:
    return set()


@dataclass(frozen=True)
class StateSpec:
    """An estimator's running state, saved in every checkpoint as ``global_step_N/<file>``.

    label / what: the estimator's name and what starts fresh, in messages.
    mode_keys / ignored: a resume ignores changes of the options ``ignored(options)`` while no mode key changed.
    never_keep: options whose change a resume never continues under ``on_resume_mismatch=keep``.
    """

    file: str
    label: str
    what: str
    mode_keys: tuple[str, ...] = ()
    ignored: Callable[[Any], set[str]] = _nothing_ignored
    never_keep: tuple[str, ...] = ()


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator, declared once.

    name: ``algorithm.adv_estimator`` (for ``builtin`` ones, the package's short name; ``verl_name`` is verl's).
    summary: one line for ``--help`` and the docs; source: the paper (arXiv id) or code it follows.
    options_cls: its options section ``algorithm.<name>`` (an ``OptionSection``; None: no options).
    estimator_cls: an :class:`~ebpo_verl.algos.estimator.Estimator` (state or diagnostics), or ``function``: a
        pure ``(scores, index, valid, row_values, pad_prefix) -> Advantages``; exactly one for ours, neither for
        verl's own (``builtin``).
    state: its checkpointed state (None: none); row_key: the option naming the ``extra_info`` field read per row
        (None: none); unique_row_key: that field identifies a prompt (checked unique over the training rows).
    study_variants: extra study names -> option overrides (e.g. ``ebpo_bb``: ``{"prior": "beta_binomial"}``).
    warning: options -> a message naming the options set that these options make the estimator ignore (None: none).
    """

    name: str
    summary: str
    source: str
    options_cls: type | None = None
    estimator_cls: type[Estimator] | None = None
    function: Callable[..., Advantages] | None = None
    state: StateSpec | None = None
    row_key: str | None = None
    unique_row_key: bool = False
    builtin: bool = False
    verl_name: str | None = None
    study_variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    warning: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        if not self.builtin and (self.estimator_cls is None) == (self.function is None):
            raise ValueError(f"estimator {self.name!r}: declare exactly one of estimator_cls and function")
        if self.state is not None and (self.estimator_cls is None or self.estimator_cls.state_cls is None):
            raise ValueError(f"estimator {self.name!r}: a state needs an estimator_cls with a state_cls")
        if self.row_key is not None and (self.options_cls is None or self.row_key not in self.options_cls.keys()):
            raise ValueError(f"estimator {self.name!r}: row_key {self.row_key!r} is not one of its options")

    @property
    def registered_name(self) -> str:
        """The name in verl's ``ADV_ESTIMATOR_REGISTRY``."""
        return self.verl_name or self.name

    @property
    def section(self) -> str:
        return f"algorithm.{self.name}"

    @property
    def stateful(self) -> bool:
        return self.state is not None

    @property
    def state_cls(self) -> type | None:
        return None if self.estimator_cls is None else self.estimator_cls.state_cls

    @property
    def option_keys(self) -> tuple[str, ...]:
        return () if self.options_cls is None else self.options_cls.keys()

    @property
    def resume_keys(self) -> tuple[str, ...]:
        """The options a resume compares with the checkpoint's (all but ``on_resume_mismatch`` itself)."""
        return tuple(k for k in self.option_keys if k != "on_resume_mismatch")

    def parse(self, node: Any) -> Any:
        """The options of a config node (None -> defaults); None for an estimator without options."""
        return None if self.options_cls is None else self.options_cls.from_mapping(node)

    def row_key_of(self, options: Any) -> str | None:
        """The ``extra_info`` field these options make the estimator read per row (None: none)."""
        return getattr(options, self.row_key) if self.row_key else None

    def new(self, options: Any = None) -> Estimator | None:
        """A fresh estimator object with ``options`` (None: the defaults); None for a pure function or verl's own."""
        if self.estimator_cls is None:
            return None
        return self.estimator_cls(self.parse(None) if options is None else options)

    def estimate(self, options: Any = None) -> Callable[..., Advantages]:
        """What one run calls each step, ``(scores, index, valid, row_values, pad_prefix) -> Advantages``: a fresh
        object (:meth:`new`) or the pure function; ValueError for verl's own."""
        if self.builtin:
            raise ValueError(f"estimator {self.name!r} is verl's own: call it through verl's registry")
        return self.function if self.function is not None else self.new(options)

    @property
    def row_kwarg(self) -> str:
        """The keyword of the per-row field in the registered verl function (``prompt_keys`` for a prompt key,
        ``labels`` for a label shared by prompts)."""
        return "prompt_keys" if self.unique_row_key else "labels"


def _specs_of(module_name: str) -> tuple[EstimatorSpec, ...]:
    module = importlib.import_module(module_name)
    specs = getattr(module, "SPECS", None)
    if not isinstance(specs, tuple) or not all(isinstance(s, EstimatorSpec) for s in specs):
        raise TypeError(f"estimator module {module_name} must define SPECS, a tuple of EstimatorSpec")
    return specs


@functools.cache
def estimators() -> dict[str, EstimatorSpec]:
    """Every estimator by name: :data:`MODULES` in order, then the installed entry points (cached: one per process)."""
    extra = tuple(ep.value for ep in entry_points(group=ENTRY_POINT_GROUP))
    table: dict[str, EstimatorSpec] = {}
    for module_name in (*MODULES, *extra):
        for spec in _specs_of(module_name):
            if spec.name in table:
                raise ValueError(f"estimator {spec.name!r} is declared twice (again in {module_name})")
            table[spec.name] = spec
    return table


def get(name: str) -> EstimatorSpec:
    """The estimator called ``name``; ValueError naming the closest and every known name."""
    table = estimators()
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"unknown estimator {name!r}; {hint}known: {', '.join(table)}")
    return table[name]


def ours() -> dict[str, EstimatorSpec]:
    """The estimators this package registers in verl (not verl's own)."""
    return {name: spec for name, spec in estimators().items() if not spec.builtin}


def stateful() -> dict[str, EstimatorSpec]:
    """The estimators whose running state is saved in every checkpoint."""
    return {name: spec for name, spec in estimators().items() if spec.stateful}
