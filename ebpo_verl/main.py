"""Training entry point: ``python -m ebpo_verl.main [overrides]`` / ``ebpo-train [overrides]``.

verl's ``main_ppo`` flow with the package config (``trainer/config/ebpo_trainer.yaml``: verl's ``ppo_trainer``
plus our options, generated from their declarations) and :class:`~ebpo_verl.trainer.ray_trainer.EBPOTaskRunner`:
one composition per command (:func:`compose`), then the pre-flight (:func:`ebpo_verl.trainer.preflight.preflight`)
before Ray starts. ``--cfg job`` runs the same, reports ``pre-flight: ok`` on stderr and prints the composed config
on stdout without starting Ray. Every refusal is one line ``ebpo-train: error: ...`` on stderr with exit status 2,
and writes nothing. Hydra's own commands (``--hydra-help``, ``--info``, ``--multirun``, ``--cfg hydra|all``,
``--config-path``/``--config-dir``, ...) go to ``hydra.main``, which composes once itself.
"""

from __future__ import annotations

import logging
import re
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import NoReturn

from ebpo_verl.ops.errors import EBPOConfigError, one_line
from ebpo_verl.ops.extras import MissingExtraError, require

try:
    require("verl", "ebpo-train", "verl", "ray", "hydra", "omegaconf")
except MissingExtraError as err:  # a plain install (the TRL users'): one line, not an ImportError's traceback
    print(f"ebpo-train: error: {err}", file=sys.stderr)
    sys.exit(2)

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from ebpo_verl.options.parsing import unknown_option_message  # noqa: E402
from ebpo_verl.trainer.config.generate import ALL_SECTIONS, estimator_names, option_lines  # noqa: E402
from ebpo_verl.trainer.preflight import preflight  # noqa: E402
from ebpo_verl.trainer.run_options import TrainerOptions  # noqa: E402

CONFIG_MODULE = "ebpo_verl.trainer.config"
CONFIG_NAME = "ebpo_trainer"
HYDRA_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
"""The console format of Hydra's default job logging, which a run under ``hydra.main`` had."""


def _fail(message: str) -> NoReturn:
    print(f"ebpo-train: error: {message}", file=sys.stderr)
    sys.exit(2)


@contextmanager
def _refusals() -> Iterator[None]:
    """A refusal inside the block (a config problem, OmegaConf's error, a held run lock): one line
    ``ebpo-train: error: ...`` on stderr and exit status 2."""
    from omegaconf.errors import OmegaConfBaseException

    from ebpo_verl.ops.locking import LockHeldError

    try:
        yield
    except (EBPOConfigError, LockHeldError, OmegaConfBaseException) as err:
        _fail(one_line(err))


def _report(lines: list[str]) -> None:
    print(f"pre-flight: ok ({'; '.join(lines)})", file=sys.stderr)


def composition_message(err: Exception) -> str:
    """One line for Hydra's refusal of an override: a key that does not exist gets did-you-mean naming the
    closest existing key (our sections list their keys), instead of Hydra's advice to add it with ``+``, which
    would silence the check (keys added on purpose with ``+`` are not refused here)."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause, match = err.__cause__, re.match(r"Could not override '([^']+)'", str(err))
    if not (match and isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key):
        return one_line(err)
    override = match.group(1)
    ours = next((c for c in ALL_SECTIONS if c.SECTION != "trainer" and override.startswith(f"{c.SECTION}.")), None)
    if ours is not None and len(cause.full_key) <= len(ours.SECTION):  # the section is absent (data.curriculum)
        option = override[len(ours.SECTION) + 1 :].split(".")[0]
        if option not in ours.keys():
            return unknown_option_message(option, ours.SECTION, ours.keys())
        return f"{ours.SECTION} is not in the config: set its options with ++{override}=... (as the recipes do)"
    if ours is not None:
        return unknown_option_message(cause.full_key.split(".")[-1], ours.SECTION, ours.keys())
    *path, key = cause.full_key.split(".")
    keys = [str(k) for k in cause.parent_node.keys()] if cause.parent_node is not None else []
    message = unknown_option_message(key, ".".join(path), [k for k in keys if path or k != "hydra"], list_valid=False)
    if "did you mean" not in message:
        message += f": the config has no such key (to add one on purpose: +{override}=...)"
    return message


def compose(overrides: list[str], config_name: str | None = None) -> DictConfig:
    """The job config Hydra composes for these overrides (Hydra's compose API); errors -> EBPOConfigError. An override
    without a key (``=5``, which Hydra takes for a config group and fails on with a traceback) is one line; overrides
    Hydra cannot parse are left to its own message."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with suppress(HydraException):
        for override in OverridesParser.create().parse_overrides(list(overrides)):
            if not override.key_or_group:
                raise EBPOConfigError(
                    f"override {override.input_line!r} has no key: write key=value with no space around '=' "
                    "(e.g. trainer.total_epochs=5)"
                )
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            return hydra_compose(config_name=config_name or CONFIG_NAME, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise EBPOConfigError(composition_message(err)) from err


def dry_run(overrides: list[str], config_name: str | None = None) -> tuple[DictConfig, list[str]]:
    """The one composition and the pre-flight of a dry run, in this process and without exiting (``--cfg job``,
    the recipes' dry runs): a training file absent here is reported as not checked. Returns (config, pre-flight
    lines); a refusal is an EBPOConfigError (one line)."""
    from omegaconf.errors import OmegaConfBaseException

    config = compose(overrides, config_name)
    try:
        return config, preflight(config, dry_run=True).lines
    except OmegaConfBaseException as err:
        raise EBPOConfigError(one_line(err)) from err


def show_job(overrides: list[str], config_name: str | None = None, package: str | None = None, resolve=False) -> None:
    """``--cfg job``: :func:`dry_run`, the pre-flight's line on stderr, the config (or ``package`` of it) on
    stdout; a refusal -> one line and exit status 2."""
    with _refusals():
        config, lines = dry_run(overrides, config_name)
        shown = config if package in (None, "_global_") else OmegaConf.select(config, package)
        if shown is None:
            raise EBPOConfigError(f"package '{package}' not found in config")
        if resolve and OmegaConf.is_config(shown):
            OmegaConf.resolve(shown)
    _report(lines)
    if not OmegaConf.is_config(shown):
        print(shown)
        return
    if package not in (None, "_global_"):
        print(f"# @package {package}")
    sys.stdout.write(OmegaConf.to_yaml(shown))


def _preflight_and_run(config: DictConfig) -> None:
    """Holding the run's locks (:func:`~ebpo_verl.trainer.checkpoint.run_lock.hold_run_outputs`: one training
    process per checkpoint folder and metrics log, a second one refused at once, naming the holder; a folder the
    locks created is removed again if the run leaves it empty): the pre-flight (a refusal: one line, exit 2), then
    training on the Ray cluster (local, or ``RAY_ADDRESS`` / ``ray_kwargs``). verl's trainer modules are imported
    only after the pre-flight."""
    from ebpo_verl.trainer.checkpoint.run_lock import hold_run_outputs

    with _refusals():
        outputs = hold_run_outputs(config.trainer)
    with outputs:
        with _refusals():
            cleared = preflight(config, dry_run=False)
        _report(cleared.lines)
        _launch(config, cleared.options.trainer)


def _launch(config: DictConfig, trainer: TrainerOptions) -> None:
    """verl's ``run_ppo`` with our TaskRunner, the launch command recorded for the metrics log, a dead or hung
    worker reported in one line (exit 1); ``trainer``: our ``trainer`` options as the pre-flight parsed them."""
    import shlex

    from omegaconf import open_dict
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from ebpo_verl.ops.provenance import LAUNCH_COMMAND_KEY
    from ebpo_verl.ops.shm import unlink_orphaned_shm
    from ebpo_verl.trainer.ray_trainer import EBPOTaskRunner
    from ebpo_verl.trainer.watchdog import failures_reported

    with open_dict(config):  # provenance of the metrics log: the trainer's Ray actor cannot see this argv
        config.trainer[LAUNCH_COMMAND_KEY] = shlex.join(sys.argv)
    auto_set_device(config)
    unlink_orphaned_shm()  # what killed workers of an earlier run or attempt left in this node's RAM
    try:
        with failures_reported(config, trainer):  # a dead or hung worker: one line, exit 1
            run_ppo(config, task_runner_class=EBPOTaskRunner)
    finally:
        unlink_orphaned_shm()


def train(overrides: list[str], config_name: str | None = None) -> None:
    """A run: the one composition, then :func:`_preflight_and_run` with the console logging that Hydra's job
    logging gave a run. A refusal is one line with exit status 2 and leaves nothing behind (no Hydra run folder)."""
    with _refusals():
        config = compose(overrides, config_name)
    logging.basicConfig(level=logging.INFO, format=HYDRA_LOG_FORMAT, stream=sys.stdout)
    _preflight_and_run(config)


@hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=CONFIG_NAME, version_base=None)
def hydra_train(config: DictConfig) -> None:
    """Hydra's own commands (``--multirun``, ``--config-dir``, ...): Hydra composes; the pre-flight, then a run."""
    _preflight_and_run(config)


def usage() -> str:
    """``--help``: what this entry point adds to verl's ``main_ppo`` and every option of ours with its default and
    allowed values (from the declarations); Hydra's 1,100-line dump is ``--cfg job``'s."""
    return "\n".join([
        "usage: ebpo-train [--cfg job [--package KEY] [--resolve]] [key=value ...]   (= python -m ebpo_verl.main)",
        *textwrap.wrap(
            "verl 0.9.1's main_ppo with EBPO (arXiv 2602.05165). What it adds to verl: the advantage estimators "
            f"{estimator_names()} (algorithm.adv_estimator, default ebpo); the package config (verl's ppo_trainer "
            "plus the options below, the math-verify reward, the curriculum sampler data.curriculum.*); a pre-flight "
            "before Ray starts (our checks, verl's validate_config at the configured world size, at least one step per "
            "epoch; every refusal one line, exit 2); the EBPO statistics (SPO trackers, DBB posteriors) in each "
            "checkpoint; an append-only metrics log (trainer.metrics_log_path).",
            110,
            break_on_hyphens=False,
        ),
        "",
        "Options (default, then allowed values; algorithm.<name>.* applies to adv_estimator=<name>, the other",
        "estimators' in one line each (allowed values: docs/baselines.md); data.curriculum.* needs",
        "data.custom_cls=CurriculumDataset and is set with ++data.curriculum.<key>=...):",
        *option_lines(),
        "",
        "  ebpo-train --cfg job [key=value ...]   the pre-flight, then the whole composed config; nothing started",
        "  ebpo-train --hydra-help                Hydra's own flags (--multirun, --info, ...: Hydra composes)",
        "Docs (source repository): docs/estimator.md (options, math), docs/training.md (running, checkpoints,",
        "metrics), recipe/ebpo/README.md (the paper's runs).",
    ])  # fmt: skip


OUR_FLAGS = {"--help": "help", "-h": "help", "--cfg": "cfg", "-c": "cfg", "--package": "package", "-p": "package",
             "--resolve": "resolve", "--config-name": "config_name", "-cn": "config_name"}  # fmt: skip
"""The flags :func:`main` handles itself (``--cfg`` only with ``job``), by :class:`Command` field; every other flag
is Hydra's own."""


@dataclass(frozen=True)
class Command:
    """An ``ebpo-train`` command line of ours: the overrides and our flags (``cfg``: ``job`` or None)."""

    overrides: tuple[str, ...] = ()
    help: bool = False
    cfg: str | None = None
    package: str | None = None
    resolve: bool = False
    config_name: str | None = None


def arguments(argv: list[str]) -> Command | None:
    """The command line parsed once; None when it is Hydra's own (a flag not in :data:`OUR_FLAGS`, ``--cfg
    hydra|all``), which ``hydra.main`` then parses itself."""
    flags: dict[str, str | bool] = {}
    overrides: list[str] = []
    args = iter(argv)
    for arg in args:
        flag, given, value = arg.partition("=")
        if not arg.startswith("-"):
            overrides.append(arg)
        elif flag not in OUR_FLAGS:
            return None
        elif OUR_FLAGS[flag] in ("help", "resolve"):
            flags[OUR_FLAGS[flag]] = True
        else:
            flags[OUR_FLAGS[flag]] = value if given else next(args, "")
            if not flags[OUR_FLAGS[flag]]:
                _fail(f"{flag} needs a value: see ebpo-train --help")
    return None if flags.get("cfg", "job") != "job" else Command(tuple(overrides), **flags)


def main() -> None:
    """Console script ``ebpo-train``: ``--help``, ``--cfg job`` (pre-flight + config), a run, or Hydra's own
    commands (through ``hydra.main``)."""
    command = arguments(sys.argv[1:])
    if command is None:
        hydra_train()
    elif command.help:
        print(usage())
    elif command.cfg:
        show_job(list(command.overrides), command.config_name, command.package, command.resolve)
    else:
        train(list(command.overrides), command.config_name)


if __name__ == "__main__":
    main()
