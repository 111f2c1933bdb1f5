"""Pre-flight of an EBPO run: everything that would otherwise fail after a full rollout, or silently.

:func:`preflight` runs in the driver before Ray starts (also for ``--cfg job``): the estimator's registration,
:class:`~ebpo_verl.trainer.run_options.RunOptions`, then :data:`CONFIG_CHECKS`, :data:`WARNINGS`, the resume check
and :data:`RUN_CHECKS`. Modules: :mod:`.config`, :mod:`.batches`, :mod:`.data`, :mod:`.registry`,
:mod:`.trust`. Every refusal is an :class:`~ebpo_verl.ops.errors.EBPOConfigError` naming the key/value/file
and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ebpo_verl.trainer.preflight.batches import check_batch_division
from ebpo_verl.trainer.preflight.config import (
    check_group_size,
    check_legacy_reward_keys,
    check_positive_ints,
    check_resume,
    check_reward_options,
    check_shaped_rewards,
    check_stock_verl_methods,
    check_v1_trainer,
    check_verl_config,
    warn_filtered_groups,
    warn_ignored_options,
    warn_versions,
)
from ebpo_verl.trainer.preflight.data import check_data, check_model_path
from ebpo_verl.trainer.preflight.registry import check_estimator_name
from ebpo_verl.trainer.preflight.trust import check_resume_trust
from ebpo_verl.trainer.run_options import RunOptions

Check = Callable[[Any, RunOptions, bool], "str | None"]
"""``check(config, options, dry_run)``: raises EBPOConfigError, or returns a line for the log (or None)."""

CONFIG_CHECKS: tuple[Check, ...] = (
    check_v1_trainer,
    check_stock_verl_methods,
    check_group_size,
    check_shaped_rewards,
    check_reward_options,
    check_legacy_reward_keys,
)
"""The checks that read only our options and the composed config (:func:`check_config`): add a config check here."""

WARNINGS: tuple[Check, ...] = (warn_ignored_options, warn_filtered_groups, warn_versions)
"""Printed on stderr (``ebpo-train: warning: ...``), never refusing."""

RUN_CHECKS: tuple[Check, ...] = (
    check_resume_trust,
    check_verl_config,
    check_batch_division,
    check_model_path,
    check_data,
)
"""After the resume check (a resume that cannot work stops before verl's check and the data are read), in this
order; their lines open the log line, the resume's closes it."""


def check_config(config: Any) -> RunOptions:
    """The run's options (:meth:`RunOptions.from_config`, after the sizes are checked positive integers) and the
    checks of :data:`CONFIG_CHECKS`; returns the options. Raises EBPOConfigError."""
    check_positive_ints(config)
    options = RunOptions.from_config(config)
    for check in CONFIG_CHECKS:
        check(config, options, False)
    return options


class Cleared(NamedTuple):
    """What a passed pre-flight hands on: the run's options, parsed once for the driver, and the lines for the log
    (``pre-flight: ok (...)``)."""

    options: RunOptions
    lines: list[str]


def preflight(config: Any, *, dry_run: bool) -> Cleared:
    """Every driver-side check of a run; returns the run's options and the lines for the log.

    The same for a real run and for ``--cfg job`` (``dry_run``), where a training file absent from this machine
    is reported as not checked instead of refused. Raises EBPOConfigError.
    """
    check_estimator_name(config)
    options = check_config(config)
    for warn in WARNINGS:
        warn(config, options, dry_run)
    resume = check_resume(config, options, dry_run)
    lines = [line for check in RUN_CHECKS if (line := check(config, options, dry_run))]
    return Cleared(options, lines + ([resume] if resume else []))
