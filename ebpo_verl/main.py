"""Training entry point: ``python -m ebpo_verl.main [overrides]`` / ``ebpo-train [overrides]``.

verl's ``main_ppo`` flow with the package config (``config/ebpo_trainer.yaml``: verl's ``ppo_trainer`` plus the
EBPO deltas) and :class:`~ebpo_verl.trainer.ray_trainer.EBPOTaskRunner`. Before Ray starts, the pre-flight
(:func:`ebpo_verl.trainer.preflight.preflight`: our checks, verl's ``validate_config`` at the configured world size, at
least one step per epoch) runs; ``--cfg job`` runs the same pre-flight, reports ``pre-flight: ok`` on stderr
and prints the composed config on stdout without starting Ray. Every refusal is one line
``ebpo-train: error: ...`` on stderr with exit status 2.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf

from ebpo_verl.ops.errors import EBPOConfigError, one_line
from ebpo_verl.options.parsing import unknown_option_message
from ebpo_verl.trainer.preflight import preflight
from ebpo_verl.trainer.run_options import STATEFUL

CONFIG_MODULE = "ebpo_verl.trainer.config"
CONFIG_NAME = "ebpo_trainer"
PREFIXES = {f"{entry.section}.": entry.option_keys for entry in STATEFUL.values()}
"""Override prefixes whose keys :func:`check_overrides` checks (did-you-mean instead of Hydra's ``+`` advice)."""


def _fail(message: str) -> NoReturn:
    print(f"ebpo-train: error: {message}", file=sys.stderr)
    sys.exit(2)


def _report(lines: list[str]) -> None:
    print(f"pre-flight: ok ({'; '.join(lines)})", file=sys.stderr)


def check_overrides(overrides: list[str]) -> None:
    """Refuse ``algorithm.ebpo.<typo>=...`` / ``algorithm.spo.<typo>=...`` before Hydra composes (Hydra would
    only advise appending ``+``).

    Overrides Hydra cannot parse are left to Hydra's own message; ``+``/``++`` additions reach
    :class:`~ebpo_verl.trainer.run_options.RunOptions`, which refuses unknown keys with the same message.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return
    for override in parsed:
        key = override.key_or_group
        if not key:
            raise EBPOConfigError(
                f"override {override.input_line!r} has no key: write key=value with no space around '=' "
                "(e.g. trainer.total_epochs=5)"
            )
        if override.is_add() or override.is_force_add():
            continue
        for prefix, valid in PREFIXES.items():
            option = key[len(prefix) :].split(".")[0] if key.startswith(prefix) else None
            if option is not None and option not in valid:
                raise EBPOConfigError(unknown_option_message(option, prefix[:-1], valid))


def compose(overrides: list[str], config_name: str | None = None) -> DictConfig:
    """The job config Hydra composes for these overrides (Hydra's compose API); errors -> EBPOConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            return hydra_compose(config_name=config_name or CONFIG_NAME, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise EBPOConfigError(one_line(err)) from err


def dry_run(overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """What ``--cfg job`` checks, in this process and without exiting: the override keys, the composition and the
    pre-flight. Returns (config, pre-flight lines); any refusal is an EBPOConfigError (one line)."""
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(overrides)
    config = compose(overrides)
    try:
        return config, preflight(config, dry_run=True)
    except OmegaConfBaseException as err:
        raise EBPOConfigError(one_line(err)) from err


def compose_config(args) -> DictConfig:
    """:func:`compose` for parsed command-line arguments; a composition error -> one line and exit status 2."""
    try:
        return compose(args.overrides, args.config_name)
    except EBPOConfigError as err:
        _fail(str(err))


def show_job(args) -> None:
    """``--cfg job``: compose as Hydra would, run the pre-flight, print the config (honours --resolve/--package)."""
    from omegaconf.errors import OmegaConfBaseException

    if args.config_path or args.config_dir:
        _fail("--config-path/--config-dir are not supported with --cfg job; pass overrides to the package config")
    config = compose_config(args)
    try:
        lines = preflight(config, dry_run=True)
        shown = config if args.package in (None, "_global_") else OmegaConf.select(config, args.package)
        if shown is None:
            raise EBPOConfigError(f"package '{args.package}' not found in config")
        if args.resolve and OmegaConf.is_config(shown):
            OmegaConf.resolve(shown)
    except EBPOConfigError as err:
        _fail(str(err))
    except OmegaConfBaseException as err:
        _fail(one_line(err))
    _report(lines)
    if not OmegaConf.is_config(shown):
        print(shown)
        return
    if args.package not in (None, "_global_"):
        print(f"# @package {args.package}")
    sys.stdout.write(OmegaConf.to_yaml(shown))


def _holding_run_outputs(run: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
    """``run`` inside :func:`~ebpo_verl.trainer.checkpoint.run_lock.hold_run_outputs`: one training
    process per checkpoint folder and metrics log; a second one is refused at once (one line naming the holder)."""

    @functools.wraps(run)
    def locked(config: DictConfig) -> None:
        from ebpo_verl.ops.locking import LockHeldError
        from ebpo_verl.trainer.checkpoint.run_lock import hold_run_outputs

        try:
            outputs = hold_run_outputs(config.trainer)
        except LockHeldError as err:
            _fail(str(err))
        with outputs:
            run(config)

    return locked


@hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=CONFIG_NAME, version_base=None)
@_holding_run_outputs
def train(config: DictConfig) -> None:
    """Pre-flight, then train on the Ray cluster (local, or ``RAY_ADDRESS`` / ``ray_kwargs``)."""
    try:
        lines = preflight(config, dry_run=False)
    except EBPOConfigError as err:
        _fail(str(err))
    _report(lines)
    import shlex

    from omegaconf import open_dict

    from ebpo_verl.ops.provenance import LAUNCH_COMMAND_KEY

    with open_dict(config):  # provenance of the metrics log: the trainer's Ray actor cannot see this argv
        config.trainer[LAUNCH_COMMAND_KEY] = shlex.join(sys.argv)

    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from ebpo_verl.ops.shm import unlink_orphaned_shm
    from ebpo_verl.trainer.ray_trainer import EBPOTaskRunner
    from ebpo_verl.trainer.watchdog import failures_reported

    auto_set_device(config)
    unlink_orphaned_shm()  # what killed workers of an earlier run or attempt left in this node's RAM
    try:
        with failures_reported(config):  # a dead or hung worker: one line, exit 1
            run_ppo(config, task_runner_class=EBPOTaskRunner)
    finally:
        unlink_orphaned_shm()


def usage() -> str:
    """``--help``: what this entry point adds to verl's ``main_ppo``, the keys of each stateful estimator
    (``options.STATEFUL``) with their defaults (from the composed config), ``--cfg job`` and the docs; Hydra's
    1,100-line dump is ``--cfg job``'s."""
    config = compose([])
    blocks = [
        f"  algorithm.{name}.{key}={'null' if value is None else value}"
        for name in STATEFUL
        for key, value in config.algorithm[name].items()
    ]
    return "\n".join([
        "ebpo-train / python -m ebpo_verl.main [key=value ...]: verl 0.9.1's main_ppo with EBPO (arXiv 2602.05165).",
        "What it adds to verl: the advantage estimators ebpo, shrinkage_js, bnpo, spo and dbb",
        "(algorithm.adv_estimator, default ebpo); the package config (verl's ppo_trainer plus the keys below, the",
        "math-verify reward, the curriculum sampler data.curriculum.*); a pre-flight before Ray starts (our checks,",
        "verl's validate_config at the configured world size, at least one step per epoch; every refusal one line,",
        "exit 2); the EBPO statistics (SPO trackers, DBB posteriors) in each checkpoint; an append-only metrics log",
        "(trainer.metrics_log_path).",
        "",
        "Options (defaults shown; algorithm.<name>.* applies to adv_estimator=<name>):",
        *blocks,
        "",
        "  ebpo-train --cfg job [key=value ...]   the pre-flight, then the whole composed config; nothing started",
        "  ebpo-train --hydra-help                Hydra's own flags",
        "Docs (source repository): docs/estimator.md (options, math), docs/training.md (running, checkpoints,",
        "metrics), recipe/ebpo/README.md (the paper's runs: python -m ebpo_verl.recipes run|table|eval --help).",
    ])  # fmt: skip


def main() -> None:
    """Console script ``ebpo-train``: our override checks, then ``--cfg job`` (pre-flight + config) or a run."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(sys.argv[1:])
    if args.help:
        print(usage())
        return
    try:
        check_overrides(args.overrides)
    except EBPOConfigError as err:
        _fail(str(err))
    other_commands = args.multirun or args.info or args.shell_completion or args.help or args.hydra_help
    if args.cfg == "job" and not (other_commands or args.run):
        show_job(args)
        return
    if args.cfg is None and not other_commands and not (args.config_path or args.config_dir):
        compose_config(args)  # Hydra's composition errors as one line, before hydra.main composes for the run
    train()


if __name__ == "__main__":
    main()
