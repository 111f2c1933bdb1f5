"""The recipes' own switches besides a run's (:class:`~ebpo_verl.recipes.spec.RunSwitches`): the modes of every
command, the table drivers' and the evaluation's; each declared once (default, allowed values, help), read from the
environment by :meth:`~ebpo_verl.options.parsing.OptionSection.from_variables` (an empty variable is unset; a bad
value is one line naming the variable) and listed by ``--help`` from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ebpo_verl.evaluate.prompts import PROTOCOLS
from ebpo_verl.options.parsing import PATH, OptionSection, nullable, option, text
from ebpo_verl.recipes.make_tables import DEFAULT_METRIC

ON_OFF = (0, 1)


def _protocol() -> Any:
    return option("paper", "the evaluation's protocol; both: one evaluation (and table) per protocol",
                  choices=(*PROTOCOLS, "both"))  # fmt: skip


def chosen_protocols(value: str) -> list[str]:
    """The protocols an ``EVAL_PROTOCOL`` value names."""
    return list(PROTOCOLS) if value == "both" else [value]


@dataclass(frozen=True)
class Modes(OptionSection):
    """What a run or table command does instead of training (every command of ``python -m ebpo_verl.recipes``)."""

    SECTION: ClassVar[str] = ""

    DRY_RUN: int = option(
        0,
        "1: list the data preparation, run the pre-flight, print the composed config; no Ray, GPUs or files",
        choices=ON_OFF,
    )
    PRINT_OVERRIDES: int = option(0, "1: print the Hydra overrides and exit", choices=ON_OFF)
    SHOW_CONFIG: int = option(0, "1: a table driver's dry run also prints each run's composed config (stdout)",
                              choices=ON_OFF)  # fmt: skip

    @property
    def dry(self) -> bool:
        """Nothing is trained, prepared or written."""
        return bool(self.DRY_RUN or self.PRINT_OVERRIDES)


@dataclass(frozen=True)
class DriveSwitches(OptionSection):
    """The table drivers' own switches."""

    SECTION: ClassVar[str] = ""

    FINAL_EVAL: int = option(
        1,
        "1: evaluate each run's last checkpoint (recipes eval) and tabulate that; 0: tabulate the training runs' "
        "own validations (LOG_DIR/<experiment>)",
        choices=ON_OFF,
    )
    EVAL_PROTOCOL: str = _protocol()
    SELECT: str = option("final", "which validation of a run the table reports (FINAL_EVAL=0)",
                         choices=("final", "best"))  # fmt: skip
    METRICS: str = option(
        DEFAULT_METRIC,
        'one table per metric, e.g. "pass@1 pass@16 maj@16 avg@n" (FINAL_EVAL=1; make_tables --metric, '
        "docs/evaluation.md#coverage)",
        rule=text("metrics separated by spaces"),
    )
    RESULTS_DIR: str | None = nullable(
        "tables go to RESULTS_DIR/rw_<REWARD>-bl_<BASELINES>/<protocol>/<table>.md; unset: WORK_DIR/results",
        PATH,
    )


@dataclass(frozen=True)
class EvalSwitches(OptionSection):
    """``recipes eval``'s switches."""

    SECTION: ClassVar[str] = ""

    EVAL_PROTOCOL: str = _protocol()
    EVAL_DIR: str | None = nullable(
        "where the generations and results go; unset: WORK_DIR/eval/<experiment>-step<N> (or the model folder's name)",
        PATH,
    )
