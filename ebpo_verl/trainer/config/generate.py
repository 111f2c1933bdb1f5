"""Everything derived from the option declarations: the package's Hydra config, the ``--help`` list, the docs tables.

``ebpo_trainer.yaml`` is verl's ``ppo_trainer`` plus :data:`SECTIONS` (our options sections, from their dataclasses)
and :data:`VERL_DEFAULTS` (the verl keys whose defaults ``ebpo-train`` changes), each declared once here or in its
dataclass. The docs command (``python -m ebpo_verl.docs_tables``, whose ``--check`` the tests run) writes the file,
the README's options table and the estimator tables of ``docs/estimator.md`` and ``docs/baselines.md`` from the
functions here.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Iterator
from typing import Any, NamedTuple

import yaml

from ebpo_verl.algos import registry
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.options import cli
from ebpo_verl.options.parsing import OptionSection, allowed, shown
from ebpo_verl.trainer.run_options import TrainerOptions

VERL_CONFIG = "pkg://verl.trainer.config"


class VerlDefault(NamedTuple):
    """A verl key whose default ``ebpo-train`` changes: the key, our value, why."""

    key: str
    value: Any
    help: str


_BARE = "a default a bare ebpo-train passes the pre-flight with (verl leaves it unset); the recipes set their own"
VERL_DEFAULTS: tuple[VerlDefault, ...] = (
    VerlDefault("algorithm.adv_estimator", "ebpo", "the estimator registered by ebpo_verl (verl.plugins entry point)"),
    VerlDefault("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 4, _BARE),
    VerlDefault("actor_rollout_ref.rollout.n", 4, "the paper's group size G (verl's n=1 is refused by the pre-flight)"),
    VerlDefault("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 4, _BARE),
    VerlDefault("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 4, _BARE),
    VerlDefault("reward.custom_reward_function.path", "pkg://ebpo_verl.reward", "the math-verify scorer shipped here"),
    VerlDefault("reward.custom_reward_function.name", "compute_score", "its function"),
)
"""New verl keys whose defaults we change go here."""

ESTIMATOR_SECTIONS: tuple[type[OptionSection], ...] = tuple(
    spec.options_cls for spec in registry.ours().values() if spec.options_cls is not None
)
"""The options sections of the estimators, in the registry's order."""

SECTIONS: tuple[type[OptionSection], ...] = (*ESTIMATOR_SECTIONS, TrainerOptions)
"""Our options sections that the config holds (``data.curriculum`` is not: the runs that use it add it,
``++data.curriculum.<key>``)."""

ALL_SECTIONS: tuple[type[OptionSection], ...] = (*ESTIMATOR_SECTIONS, CurriculumOptions, TrainerOptions)
"""Every options section of the package (``--help``, the README table)."""


def _tree() -> dict[str, Any]:
    """The file's keys as nested dicts; a leaf is (value, help). verl's keys first: each parent keeps the place
    where it first appears, so our sections follow ``algorithm.adv_estimator`` and the file reads in verl's order."""
    leaves = [(d.key, d.value, d.help) for d in VERL_DEFAULTS]
    for cls in SECTIONS:
        leaves += [(f"{cls.SECTION}.{f.name}", f.default, f.metadata["help"]) for f in cls.declarations()]
    tree: dict[str, Any] = {}
    for key, value, help_ in leaves:
        *parents, name = key.split(".")
        functools.reduce(lambda node, parent: node.setdefault(parent, {}), parents, tree)[name] = (value, help_)
    return tree


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1000).removesuffix("\n...\n").strip()


def _emit(tree: dict[str, Any], depth: int = 0) -> Iterator[str]:
    indent = "  " * depth
    for name, node in tree.items():
        if isinstance(node, dict):
            yield f"{indent}{name}:"
            yield from _emit(node, depth + 1)
            continue
        value, help_ = node
        comment = f"{indent}# "
        yield from textwrap.wrap(help_, 120 - len(comment), initial_indent=comment, subsequent_indent=comment)
        yield f"{indent}{name}: {_scalar(value)}"


def config_yaml() -> str:
    """The text of ``ebpo_trainer.yaml``."""
    head = [
        "# GENERATED from the option declarations by `python -m ebpo_verl.docs_tables`: do not edit.",
        "# verl's own ppo_trainer.yaml (from the installed wheel) plus our options and the verl defaults we change;",
        "# used by `python -m ebpo_verl.main` / `ebpo-train` (`ebpo-train --help` lists the options).",
        "hydra:",
        "  searchpath:",
        f"    - {VERL_CONFIG}",
        "defaults:",
        "  - ppo_trainer",
        "  - _self_",
    ]
    return "\n".join([*head, *_emit(_tree())]) + "\n"


def default_estimator() -> registry.EstimatorSpec:
    """The estimator a bare ``ebpo-train`` runs (our default of ``algorithm.adv_estimator``)."""
    return registry.get(VERL_DEFAULTS[0].value)


def shown_in_full(cls: type[OptionSection]) -> bool:
    """Whether ``--help`` and the README show a section option by option: the default estimator's and the run's
    (curriculum, trainer); each other estimator's fit one line (docs/baselines.md), however many there are."""
    return not cls.SECTION.startswith("algorithm.") or cls.SECTION == default_estimator().section


def option_lines() -> list[str]:
    """``--help``'s options: ``section.key=default  (allowed)`` per option of a section shown in full, and
    ``section: key=default, ...`` for each other estimator's section."""
    lines = []
    for cls in ALL_SECTIONS:
        if shown_in_full(cls):
            lines += [f"  {cls.SECTION}.{f.name}={shown(f.default)}  ({allowed(f)})" for f in cls.declarations()]
        else:
            text = f"{cls.SECTION}: " + ", ".join(f"{f.name}={shown(f.default)}" for f in cls.declarations())
            lines += textwrap.wrap(text, 118, initial_indent="  ", subsequent_indent="      ")
    return lines


def estimator_names() -> str:
    """The estimators of ours in prose, in the registry's order: ``ebpo, shrinkage_js, bnpo, spo and dbb``."""
    names = list(registry.ours())
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def options_table() -> str:
    """The README's options table: each section shown in full with its options' defaults, and one row naming the
    other estimators' sections (their tables: ``docs/baselines.md``; allowed values: ``--help``)."""
    rows = ["| section | options (defaults) |", "|---|---|"]
    others = [cls.SECTION for cls in ALL_SECTIONS if not shown_in_full(cls)]
    for cls in ALL_SECTIONS:
        if shown_in_full(cls):
            rows.append(
                f"| `{cls.SECTION}` | {', '.join(f'`{f.name}={shown(f.default)}`' for f in cls.declarations())} |"
            )
        elif cls.SECTION == others[0]:
            names = ", ".join(f"`{section.removeprefix('algorithm.')}`" for section in others)
            rows.append(f"| `algorithm.<name>` | the other estimators' ({names}): [baselines.md](docs/baselines.md) |")
    return "\n".join(rows) + "\n"


def option_table(cls: type[OptionSection]) -> str:
    """One options section as a Markdown table: key, default, allowed values, help (from the declarations)."""
    return cli.options_table(cls, name=str, head="key")


def estimators_table() -> str:
    """Every estimator of the registry: name, verl name, what it is, source, options section, checkpointed state."""
    rows = ["| name | `algorithm.adv_estimator` | what | source | options | state |", "|---|---|---|---|---|---|"]
    for name, spec in registry.estimators().items():
        options = f"`{spec.section}`" if spec.options_cls is not None else "none"
        state = f"`{spec.state.file}`" if spec.state is not None else "none"
        owner = "verl's own" if spec.builtin else f"`{spec.registered_name}`"
        what, source = cli.cell(spec.summary), cli.cell(spec.source)
        rows.append(f"| `{name}` | {owner} | {what} | {source} | {options} | {state} |")
    return "\n".join(rows) + "\n"


def baseline_option_tables() -> str:
    """The options tables of every estimator of ours with options but the default one (:func:`default_estimator`,
    whose table is docs/estimator.md's)."""
    blocks = [
        f"`{spec.section}` ({name}):\n\n{option_table(spec.options_cls)}"
        for name, spec in registry.ours().items()
        if spec.options_cls is not None and name != default_estimator().name
    ]
    return "\n".join(blocks)
