"""The one estimator registry: every advantage estimator the package knows, each declared once beside its math.

An estimator module (``ebpo_verl.algos.<name>``) is its pure ``compute_<name>_advantages(batch, options[, state])``
and one declaration, ``SPECS = (EstimatorSpec(...), ...)`` (:class:`EstimatorSpec`). Adding one is a new module
plus one line in :data:`MODULES` (out of tree: an entry point of group :data:`ENTRY_POINT_GROUP`, whose options
``ebpo-train`` sets with ``++algorithm.<name>.<key>=...``), then ``python -m ebpo_verl.docs_tables`` (the one docs
command) to rewrite the generated files. Everything else reads :func:`estimators`, and every caller makes its
object with :func:`new_estimator`. Imports neither verl nor Ray: the TRL integration reads it too.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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

SAMPLE_INDEX = "sample_index"
"""``row_input`` of an estimator that reads each row's rollout sample index (its place in its group's sampling)."""


@dataclass(frozen=True)
class RowSource:
    """Where an estimator's per-row values come from (:meth:`EstimatorSpec.row_source`): each row's ``extra_info``
    field ``field`` (a dataset column under TRL), or, with ``field`` None, each row's rollout sample index."""

    field: str | None = None

    @property
    def sample_index(self) -> bool:
        return self.field is None


def always(why: str) -> Callable[[Any], str]:
    """A fact that holds whatever the options (``pass_rates=always("...")``)."""
    return lambda options: why


@dataclass(frozen=True)
class StateSpec:
    """An estimator's running state, saved in every checkpoint as ``global_step_N/<file>``.

    cls: the state class (:class:`~ebpo_verl.algos.estimator.State`; ``cls()`` is a fresh run's).
    label / what: the estimator's name and what starts fresh, in messages.
    mode_keys / ignored: a resume ignores changes of the options ``ignored(options)`` while no mode key changed.
    never_keep: options whose change a resume never continues under ``on_resume_mismatch=keep``.
    """

    cls: type
    file: str
    label: str
    what: str
    mode_keys: tuple[str, ...] = ()
    ignored: Callable[[Any], set[str]] = lambda options: set()
    never_keep: tuple[str, ...] = ()


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator, declared once.

    name: ``algorithm.adv_estimator`` (for ``builtin`` ones, the package's short name; ``verl_name`` is verl's).
    summary: one line for ``--help`` and the docs; source: the paper (arXiv id) or code it follows.
    compute: its pure ``compute_<name>_advantages(batch, options, state) -> Advantages``, without ``options``
        when ``options_cls`` is None and without ``state`` when ``state`` is None; verl's own (``builtin``) have none.
    options_cls: its options section ``algorithm.<name>`` (an ``OptionSection``; None: no options).
    state: its checkpointed state (None: stateless).
    row_input: what it reads per row besides uid and reward: None (nothing), :data:`SAMPLE_INDEX` (the rollout
        sample index), or the name of the option naming an ``extra_info`` field (null value: nothing);
        unique_row_key: that field identifies a prompt (checked unique over the training rows).
    pass_rates: options -> why it reads rewards as pass rates (its step refuses other rewards, so no shaped
        reward), or None; min_group: options -> why it needs ``rollout.n >= 2``, or None.
    warning: options -> a message naming the options set that these options make the estimator ignore (None: none).
    builtin / verl_name: verl's own estimator, and its name in verl's registry when it differs from ``name``;
        verl_variants: verl's other names of it (variants taking the same inputs); sum_pi_squared: verl's function
        reads the actor's per-token sum of squared token probabilities (OTB; the pre-flight checks the actor
        computes it, ``ebpo-train``'s trainer passes it).
    """

    name: str
    summary: str
    source: str
    compute: Callable[..., Advantages] | None = None
    options_cls: type | None = None
    state: StateSpec | None = None
    row_input: str | None = None
    unique_row_key: bool = False
    pass_rates: Callable[[Any], str | None] = lambda options: None
    min_group: Callable[[Any], str | None] = lambda options: None
    warning: Callable[[Any], str | None] | None = None
    builtin: bool = False
    verl_name: str | None = None
    verl_variants: tuple[str, ...] = ()
    sum_pi_squared: bool = False

    def __post_init__(self) -> None:
        problem = _declaration_problem(self)
        if problem:
            raise ValueError(f"estimator {self.name!r}: {problem}")

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
        return None if self.state is None else self.state.cls

    @property
    def option_keys(self) -> tuple[str, ...]:
        return () if self.options_cls is None else self.options_cls.keys()

    @property
    def resume_keys(self) -> tuple[str, ...]:
        """The options a resume compares with the checkpoint's (all but ``on_resume_mismatch`` itself)."""
        return tuple(k for k in self.option_keys if k != "on_resume_mismatch")

    @property
    def row_key(self) -> str | None:
        """The option naming the ``extra_info`` field read per row (None: it reads none)."""
        return None if self.row_input in (None, SAMPLE_INDEX) else self.row_input

    @property
    def reads_sample_index(self) -> bool:
        return self.row_input == SAMPLE_INDEX

    def parse(self, node: Any) -> Any:
        """The options of a config node (None -> defaults); None for an estimator without options."""
        return None if self.options_cls is None else self.options_cls.from_mapping(node)

    def options_of(self, options: Any) -> Any:
        """``options`` as this estimator's options dataclass: an instance as is, a mapping validated by
        ``from_mapping`` (one-line ValueError naming the key), None the defaults; None without an options section."""
        cls = self.options_cls
        if cls is None:
            if options:  # None or an empty mapping
                raise ValueError(f"estimator {self.name} has no options: pass None")
            return None
        if isinstance(options, cls):
            return options
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"options must be a {cls.__name__}, a mapping or None, not {type(options).__name__}")
        return cls.from_mapping(options)

    def warning_of(self, options: Any) -> str | None:
        """The message naming the options set that ``options`` make this estimator ignore (:attr:`warning`), or
        None."""
        return self.warning(options) if self.warning is not None else None

    def warn_ignored(self, options: Any, stacklevel: int = 2) -> None:
        """A RuntimeWarning of :meth:`warning_of`, if any; ``stacklevel`` as in :func:`warnings.warn`, counted from
        the caller."""
        if message := self.warning_of(options):
            warnings.warn(f"{self.name.upper()}: {message}", RuntimeWarning, stacklevel=stacklevel + 1)

    @property
    def row_option(self) -> str | None:
        """The full name of the option naming the ``extra_info`` field read per row (``algorithm.<name>.<key>``),
        for messages; None when it reads none."""
        return f"{self.section}.{self.row_key}" if self.row_key else None

    def row_key_of(self, options: Any) -> str | None:
        """The ``extra_info`` field these options make the estimator read per row (None: none)."""
        return getattr(options, self.row_key) if self.row_key else None

    def row_source(self, options: Any) -> RowSource | None:
        """The one answer to what this estimator with ``options`` reads per row: the rollout sample index, the
        ``extra_info`` field the options name, or nothing (None); each caller reads its rows from it."""
        if self.reads_sample_index:
            return RowSource()
        field = self.row_key_of(options)
        return None if field is None else RowSource(field)

    @property
    def row_kwarg(self) -> str:
        """The keyword of the per-row field in the registered verl function (``prompt_keys`` for a prompt key,
        ``labels`` for a label shared by prompts)."""
        return "prompt_keys" if self.unique_row_key else "labels"


def _declaration_problem(spec: EstimatorSpec) -> str | None:
    """What makes a declaration unusable (one line), or None: its function cannot take the parts it declares
    (options that would never reach the math), a row input that is not one of its options, a state class that
    breaks the :class:`~ebpo_verl.algos.estimator.State` contract."""
    if spec.builtin:
        return "verl's own estimators declare no compute" if spec.compute is not None else None
    if spec.sum_pi_squared or spec.verl_variants:
        return "sum_pi_squared and verl_variants describe verl's own estimators (builtin=True)"
    if spec.compute is None:
        return f"declare compute=compute_{spec.name}_advantages"
    parts = ["batch"] + ["options"] * (spec.options_cls is not None) + ["state"] * (spec.state is not None)
    try:
        inspect.signature(spec.compute).bind(*parts)
    except TypeError:
        return (
            f"{spec.compute.__name__} must take ({', '.join(parts)}) as declared by options_cls and state "
            "(options or a state it cannot take would never reach the math)"
        )
    if spec.row_key is not None and spec.row_key not in spec.option_keys:
        return f"row_input {spec.row_input!r} is neither {SAMPLE_INDEX!r} nor one of its options"
    return None if spec.state is None else _state_problem(spec.state.cls)


def _state_problem(cls: type) -> str | None:
    """A fresh ``cls()`` must have state_dict / load_state_dict / reset and survive a JSON round trip."""
    missing = [m for m in ("state_dict", "load_state_dict", "reset") if not callable(getattr(cls, m, None))]
    if missing:
        return f"state class {cls.__name__} lacks {', '.join(missing)} (the State contract)"
    try:
        fresh = cls()
        saved = json.loads(json.dumps(fresh.state_dict()))
        restored = cls()
        restored.load_state_dict(saved)
        restored.reset()
        same = restored.state_dict() == fresh.state_dict()
    except Exception as err:  # noqa: BLE001 - any failure breaks the contract; named in the one line
        return f"state class {cls.__name__} fails the State contract's JSON round trip: {err}"
    return None if same else f"state class {cls.__name__}: a fresh state does not survive its JSON round trip"


def new_estimator(spec: EstimatorSpec | str, options: Any = None) -> Estimator:
    """The one factory: a fresh :class:`~ebpo_verl.algos.estimator.Estimator` of ``spec`` (or the registered name)
    with ``options``: its options dataclass as is, a mapping validated by ``from_mapping`` (one-line ValueError
    naming the key), None the defaults. ValueError for verl's own and for options of an estimator without any."""
    spec = get(spec) if isinstance(spec, str) else spec
    if spec.builtin:
        raise ValueError(f"estimator {spec.name!r} is verl's own: call it through verl's registry")
    return Estimator(spec, spec.options_of(options))


def _specs_of(module_name: str) -> tuple[EstimatorSpec, ...]:
    specs = getattr(importlib.import_module(module_name), "SPECS", None)
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


def by_verl_name(name: str) -> EstimatorSpec | None:
    """The estimator that verl's registry calls ``name`` (``algorithm.adv_estimator``: its registered name or one of
    its ``verl_variants``); None for a name outside this registry."""
    for spec in estimators().values():
        if name == spec.registered_name or name in spec.verl_variants:
            return spec
    return None


def ours() -> dict[str, EstimatorSpec]:
    """The estimators this package registers in verl (not verl's own)."""
    return {name: spec for name, spec in estimators().items() if not spec.builtin}


def stateful() -> dict[str, EstimatorSpec]:
    """The estimators whose running state is saved in every checkpoint."""
    return {name: spec for name, spec in estimators().items() if spec.stateful}
