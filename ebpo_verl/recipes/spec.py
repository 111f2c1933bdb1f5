"""One training run of the recipes, built from the environment variables the run scripts document.

:meth:`RunSpec.from_env` reads and validates every switch once (a bad one is a :class:`RecipeError`, one line
naming the switch and the fix); the spec then owns the experiment name, the training file, the schedule, the
data-preparation commands and the Hydra overrides for ``python -m ebpo_verl.main``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from omegaconf import OmegaConf

from ebpo_verl.evaluate.prompts import BENCHMARKS
from ebpo_verl.options.parsing import PATH, OptionSection, Rule, ints, nullable, option, text
from ebpo_verl.recipes.presets import (
    ALIASES,
    MAX_RESPONSE,
    ORDER_BASE,
    ORDERS,
    PRESETS,
    REWARDS,
    ROLLOUT,
    SHARED,
    SINGLE_STREAM,
    TOPICS,
    Setting,
)

BASELINES = ("paper", "canonical")
DIRS = {"DATA_DIR": "data", "CKPT_DIR": "ckpt", "LOG_DIR": "logs"}
"""The folders :class:`Paths` holds after WORK_DIR: switch -> the default, a folder of WORK_DIR."""
SCHEDULE_VARS = ("TOTAL_STEPS", "TOTAL_EPOCHS", "TEST_FREQ", "SAVE_FREQ", "VAL_SETS", "VAL_N")
MODELS_DIR = Path(__file__).with_name("models")
PERIOD = Rule(lambda x: x == -1 or (isinstance(x, int) and x >= 1), "a positive integer or -1 (never)")


@dataclass(frozen=True)
class RunSwitches(OptionSection):
    """The switches of a training run (environment variables), each declared once with its default: ``run MODEL
    --help`` lists them from here and :meth:`RunSpec.from_env` reads its defaults and choices here (its own checks
    name the switch and the fix)."""

    SECTION: ClassVar[str] = ""

    ALGO: str = option("ebpo", "the preset", choices=tuple(PRESETS))
    BASELINES: str = option(
        "paper",
        "paper: each baseline as the authors ran it | canonical: as its own paper and verl's docs define it "
        "(docs/baselines.md)",
        choices=BASELINES,
    )
    REWARD: str = option(
        "paper",
        "paper: the authors' `Answer:` rule, +1/-1 (ebpo_verl.paper_reward) | math_verify: ebpo_verl.reward, "
        "math-verify, 1/0",
        choices=tuple(REWARDS),
    )
    GROUP_SIZE: int = option(4, "responses per prompt G (rollout.n); at least 2 (1 for spo)", rule=ints(1))
    TRAIN_BATCH: int | None = nullable(
        "prompts per step (data.train_batch_size); the rivals table: 2048 / G; unset: the shared setup's 512", ints(1)
    )
    ORDER: str = option(
        "topic",
        "topic | naive (file order, EBPO-naive) | difficulty (pass rates of the model) | random",
        choices=tuple(ORDERS),
    )
    TOPICS: str = option(
        "embed",
        "labels for ORDER=topic: embed (all-MiniLM-L6-v2 + UMAP + k-means, K=10, seed 42) | file (TRAIN_FILE "
        "carries extra_info.topic)",
        choices=TOPICS,
    )
    MODEL_PATH: str | None = nullable("HF id or local path of the policy; unset: the model config's", PATH)
    WORK_DIR: str = option("./ebpo_runs", "root of everything below (multi-node: a folder every node sees)", rule=PATH)
    DATA_DIR: str | None = nullable("prepared parquet files (prepared when missing); unset: WORK_DIR/data", PATH)
    DATA_LOCAL_DIR: str | None = nullable(
        "ebpo_verl.data.all reads the datasets from files there instead of the hub", PATH
    )
    TRAIN_FILE: str | None = nullable("training parquet; unset: derived from DATA_DIR, ORDER and TOPICS", PATH)
    CKPT_DIR: str | None = nullable("checkpoints go to CKPT_DIR/EXPERIMENT; unset: WORK_DIR/ckpt", PATH)
    KEEP_CKPTS: int = option(2, "checkpoints kept per run (~12 bytes per parameter each)", rule=ints(1))
    LOG_DIR: str | None = nullable(
        "metrics go to LOG_DIR/EXPERIMENT/metrics.jsonl (append-only); unset: WORK_DIR/logs", PATH
    )
    NNODES: int = option(4, "nodes of the Ray cluster", rule=ints(1))
    GPUS_PER_NODE: int = option(8, "GPUs per node", rule=ints(1))
    PROJECT: str = option("ebpo", "trainer.project_name", rule=text("a name"))
    EXPERIMENT: str | None = nullable(
        "unset: <model>-<ALGO>-g<GROUP_SIZE>-<ORDER>-rw_<REWARD>-bl_<BASELINES>", text("a name")
    )
    TOTAL_STEPS: int | None = nullable("trainer.total_training_steps (the run stops there); unset: no limit", ints(1))
    TOTAL_EPOCHS: int | None = nullable(
        "unset: TOTAL_STEPS when that is set, else 1 for ORDER=difficulty and 3 otherwise", ints(1)
    )
    TEST_FREQ: int = option(10, "validation period in steps (-1: never)", rule=PERIOD)
    SAVE_FREQ: int = option(10, "checkpoint period in steps (-1: never)", rule=PERIOD)
    VAL_SETS: str = option(
        ",".join(BENCHMARKS), f"validation sets, comma separated, of {' '.join(BENCHMARKS)}", rule=text("names")
    )
    VAL_N: int = option(16, "samples per validation problem", rule=ints(1))
    PYTHON: str | None = nullable(
        "interpreter with ebpo-verl installed; unset: python3 in the scripts, else this one", PATH
    )
    LOGGERS: str = option("[console]", "trainer.logger, e.g. [console,wandb]", rule=text("a Hydra list"))


SWITCHES = RunSwitches.defaults()


def default(name: str) -> str:
    """A switch's declared default as the environment would carry it."""
    return str(SWITCHES[name])


def choices(name: str) -> tuple[str, ...]:
    return next(f.metadata["choices"] for f in RunSwitches.declarations() if f.name == name)


RUN_DEFAULT_SCHEDULE = {name: default(name) for name in ("TEST_FREQ", "SAVE_FREQ", "VAL_SETS", "VAL_N")}
"""Schedule of a single run when the environment sets none (TOTAL_STEPS / TOTAL_EPOCHS: see :class:`Schedule`)."""


class RecipeError(ValueError):
    """A switch the recipes refuse; the message is one line naming it and the fix."""


@dataclass(frozen=True)
class Model:
    """A model config file (``ebpo_verl/recipes/models/<tag>.yaml``): its ``tag``, default ``path``, table ``label``
    and ``overrides`` (the model's layout); its ``#`` comment lines are the ``run <tag> --help`` description."""

    tag: str
    path: str
    label: str
    overrides: tuple[str, ...]
    description: str

    @classmethod
    def load(cls, tag: str) -> Model:
        file = MODELS_DIR / f"{tag}.yaml"
        if not file.is_file():
            raise RecipeError(f"no model config {tag!r} (one of: {' '.join(model_tags())})")
        text = file.read_text()
        data = OmegaConf.to_container(OmegaConf.create(text))
        description = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
        return cls(data["tag"], data["path"], data["label"], tuple(data["overrides"]), description)


def model_tags() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def _int(env: Mapping[str, str], name: str, minimum: int, what: str, allow_never: bool = False) -> int:
    value = env[name]
    if allow_never and value == "-1":
        return -1
    if not re.fullmatch(r"[0-9]{1,9}", value) or int(value) < minimum:
        raise RecipeError(f"{name}={value} is not an integer >= {minimum} ({what}): set {name} to such an integer")
    return int(value)


def _choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise RecipeError(f"unknown {name}={value} (one of: {' '.join(choices)})")
    return value


def hydra_list(paths: Sequence[str]) -> str:
    """Hydra list literal of quoted paths: ``['a','b']``."""
    for path in paths:
        if "'" in path:
            raise RecipeError(f"path contains a single quote, which Hydra cannot take: {path}")
    return "[" + ",".join(f"'{p}'" for p in paths) + "]"


@dataclass(frozen=True)
class Schedule:
    """Length and cadence of a run, the schedule switches of :class:`RunSwitches` (TOTAL_EPOCHS' default is
    TOTAL_STEPS when that is set, so that the epochs are never the limit)."""

    total_steps: int | None
    total_epochs: int
    test_freq: int
    save_freq: int
    val_sets: tuple[str, ...]
    val_n: int

    @classmethod
    def from_env(cls, env: Mapping[str, str], order: str) -> Schedule:
        env = {**RUN_DEFAULT_SCHEDULE, **{k: v for k, v in env.items() if v}}
        steps = _int(env, "TOTAL_STEPS", 1, "training steps") if env.get("TOTAL_STEPS") else None
        if "TOTAL_EPOCHS" not in env:
            env["TOTAL_EPOCHS"] = str(steps) if steps else ("1" if order == "difficulty" else "3")
        sets = tuple(name for name in re.split(r"[, ]+", env["VAL_SETS"]) if name)
        if not sets:
            raise RecipeError(f"VAL_SETS is empty: name at least one of {' '.join(BENCHMARKS)}")
        for name in sets:
            _choice("VAL_SETS entry", name, BENCHMARKS)
        return cls(
            total_steps=steps,
            total_epochs=_int(env, "TOTAL_EPOCHS", 1, "passes over the training set"),
            test_freq=_int(env, "TEST_FREQ", 1, "steps, or -1 for never", allow_never=True),
            save_freq=_int(env, "SAVE_FREQ", 1, "steps, or -1 for never", allow_never=True),
            val_sets=sets,
            val_n=_int(env, "VAL_N", 1, "samples per validation problem"),
        )


@dataclass(frozen=True)
class Paths:
    """WORK_DIR and the folders under it (each can be set on its own)."""

    work: str
    data: str
    ckpt: str
    logs: str


@dataclass(frozen=True)
class Shared:
    """The switches runs and table drivers share."""

    reward: str
    baselines: str
    paths: Paths
    keep_ckpts: int
    nnodes: int
    gpus_per_node: int
    project: str
    loggers: str
    data_local_dir: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Shared:
        defaults = {name: default(name) for name in ("REWARD", "BASELINES", "KEEP_CKPTS", "NNODES", "GPUS_PER_NODE")}
        env = {**defaults, **{k: v for k, v in env.items() if v}}
        work = env.get("WORK_DIR") or os.path.abspath(default("WORK_DIR"))
        dirs = {var: env.get(var) or os.path.join(work, sub) for var, sub in DIRS.items()}
        return cls(
            reward=_choice("REWARD", env["REWARD"], choices("REWARD")),
            baselines=_choice("BASELINES", env["BASELINES"], choices("BASELINES")),
            paths=Paths(work, *dirs.values()),
            keep_ckpts=_int(env, "KEEP_CKPTS", 1, "checkpoints kept per run"),
            nnodes=_int(env, "NNODES", 1, "nodes"),
            gpus_per_node=_int(env, "GPUS_PER_NODE", 1, "GPUs per node"),
            project=env.get("PROJECT") or default("PROJECT"),
            loggers=env.get("LOGGERS") or default("LOGGERS"),
            data_local_dir=env.get("DATA_LOCAL_DIR") or None,
        )


def python() -> str:
    """The interpreter for the commands the recipes run (PYTHON, else the one running the recipes)."""
    return os.environ.get("PYTHON") or sys.executable


def data_command(data: str, sets: Sequence[str], local_dir: str | None) -> list[str]:
    """The command that writes the parquet files of ``sets`` to ``data`` (DATA_LOCAL_DIR: from files there)."""
    local = ["--local-dir", local_dir] if local_dir else []
    return [python(), "-m", "ebpo_verl.data.all", "--out-dir", data, "--only", *sets, *local]


@dataclass(frozen=True)
class RunSpec:
    """One training run: model, preset, group size, order, reward, baselines, schedule, paths, extra overrides."""

    model: Model
    model_path: str
    algo: str
    group_size: int
    order: str
    topics: str
    shared: Shared
    schedule: Schedule
    experiment: str
    train_file: str | None
    extra: tuple[str, ...] = field(default=())
    train_batch: int | None = None
    """TRAIN_BATCH: prompts per step (data.train_batch_size) instead of the shared setup's 512."""

    @classmethod
    def from_env(cls, model: str | Model, env: Mapping[str, str], extra: Sequence[str] = ()) -> RunSpec:
        """Read and check every switch (defaults: ALGO=ebpo, GROUP_SIZE=4, ORDER=topic, TOPICS=embed, ...)."""
        model = model if isinstance(model, Model) else Model.load(model)
        env = {k: v for k, v in env.items() if v}  # an empty switch is an unset one
        algo = ALIASES.get(env.get("ALGO", default("ALGO")), env.get("ALGO", default("ALGO")))
        _choice("ALGO", algo, choices("ALGO"))
        order = _choice("ORDER", env.get("ORDER", default("ORDER")), choices("ORDER"))
        topics = _choice("TOPICS", env.get("TOPICS", default("TOPICS")), choices("TOPICS"))
        env.setdefault("GROUP_SIZE", default("GROUP_SIZE"))
        if algo in SINGLE_STREAM:
            group = _int(env, "GROUP_SIZE", 1, "responses per prompt")
        else:
            group = _int(env, "GROUP_SIZE", 2, "responses per prompt; group baselines need two")
        shared = Shared.from_env(env)
        schedule = Schedule.from_env({k: env[k] for k in SCHEDULE_VARS if k in env}, order)
        train_file = env.get("TRAIN_FILE") or None
        train_batch = _int(env, "TRAIN_BATCH", 1, "prompts per step") if "TRAIN_BATCH" in env else None
        if order == "topic" and topics == "file" and not train_file:
            raise RecipeError(f"TOPICS={topics} needs TRAIN_FILE=<parquet whose extra_info carries 'topic'>")
        experiment = env.get("EXPERIMENT") or (
            f"{model.tag}-{algo}-g{group}-{order}{f'-b{train_batch}' if train_batch else ''}"
            f"-rw_{shared.reward}-bl_{shared.baselines}"
        )
        spec = cls(
            model=model,
            model_path=env.get("MODEL_PATH") or model.path,
            algo=algo,
            group_size=group,
            order=order,
            topics=topics,
            shared=shared,
            schedule=schedule,
            experiment=experiment,
            train_file=train_file,
            extra=tuple(extra),
            train_batch=train_batch,
        )
        spec.overrides()  # paths Hydra cannot take are refused here, once
        return spec

    # ------------------------------------------------------------------ files
    @property
    def train_path(self) -> str:
        """The training parquet: TRAIN_FILE, else the one this ORDER / TOPICS derives from DATA_DIR."""
        data = self.shared.paths.data
        if self.train_file:
            return self.train_file
        if self.order == "topic":
            return os.path.join(data, "dapo_math.topics_k10.parquet")
        if self.order == "difficulty":
            return os.path.join(data, f"dapo_math.pass_rate.{self.model_path.rstrip('/').split('/')[-1]}.parquet")
        return os.path.join(data, "dapo_math.parquet")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.shared.paths.logs, self.experiment)

    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.shared.paths.ckpt, self.experiment)

    def preparation(self) -> list[list[str]]:
        """The data-preparation commands still needed (files missing on this machine), in order."""
        data, commands = self.shared.paths.data, []
        sets = ["dapo_math", *self.schedule.val_sets]
        if any(not os.path.isfile(os.path.join(data, f"{name}.parquet")) for name in sets):
            commands.append(data_command(data, sets, self.shared.data_local_dir))
        train, source = self.train_path, os.path.join(data, "dapo_math.parquet")
        if not self.train_file and not os.path.isfile(train):
            if self.order == "topic":
                commands.append([python(), "-m", "ebpo_verl.data.label_topics", "--in", source, "--out", train]
                                + ["--k", "10", "--seed", "42"])  # fmt: skip
            elif self.order == "difficulty":
                commands.append([python(), "-m", "ebpo_verl.evaluate.pass_rate", "--model", self.model_path]
                                + ["--in", source, "--out", train, "--n", "16", "--temperature", "1.0"])  # fmt: skip
        return commands

    # -------------------------------------------------------------- overrides
    def settings(self) -> list[Setting]:
        """What this run sets on top of the shared setup: order, reward, then the preset (which wins)."""
        return [
            *ORDER_BASE,
            *ORDERS[self.order],
            *REWARDS[self.shared.reward],
            *PRESETS[self.algo].settings(self.shared.baselines),
        ]

    def overrides(self) -> list[str]:
        """The Hydra overrides of ``python -m ebpo_verl.main`` (model layout and extra arguments last, winning)."""
        sh, sc, paths = self.shared, self.schedule, self.shared.paths
        val_files = [os.path.join(paths.data, f"{name}.parquet") for name in sc.val_sets]
        out = [
            f"data.val_files={hydra_list(val_files)}",
            *(s.override for s in SHARED),
            f"actor_rollout_ref.model.path={self.model_path}",
            f"{ROLLOUT}.n={self.group_size}",
            f"{ROLLOUT}.val_kwargs.n={sc.val_n}",
            f"trainer.logger={sh.loggers}",
            f"trainer.project_name={sh.project}",
            f"trainer.experiment_name={self.experiment}",
            f"trainer.nnodes={sh.nnodes}",
            f"trainer.n_gpus_per_node={sh.gpus_per_node}",
            f"trainer.default_local_dir={self.ckpt_dir}",
            f"trainer.max_actor_ckpt_to_keep={sh.keep_ckpts}",
            f"trainer.metrics_log_path={os.path.join(self.log_dir, 'metrics.jsonl')}",
            f"data.train_files={hydra_list([self.train_path])}",
            f"data.max_response_length={MAX_RESPONSE}",
            f"trainer.total_epochs={sc.total_epochs}",
            f"trainer.test_freq={sc.test_freq}",
            f"trainer.save_freq={sc.save_freq}",
            "trainer.val_before_train=True",
        ]
        if sc.total_steps:
            out.append(f"trainer.total_training_steps={sc.total_steps}")
        out += [s.override for s in self.settings()]
        out += [f"data.train_batch_size={self.train_batch}"] if self.train_batch else []
        return out + list(self.model.overrides) + list(self.extra)

    def command(self) -> list[str]:
        return [python(), "-m", "ebpo_verl.main", *self.overrides()]


def canonical_overrides(overrides: Sequence[str]) -> list[str]:
    """Overrides in a canonical form: one per key (the last, as Hydra applies them), sorted by key."""
    by_key = {item.split("=", 1)[0].lstrip("+~"): item for item in map(str.strip, overrides)}
    return [by_key[key] for key in sorted(by_key)]


def variant_suffix(schedule_items: Sequence[str], overrides: Sequence[str]) -> str:
    """``""`` on a driver's own schedule without overrides, else ``-v<8 hex digits>``: a hash of the schedule
    settings that differ from the driver's defaults (``VAR=value`` in :data:`SCHEDULE_VARS` order) and of the
    overrides in :func:`canonical_overrides` form, so the same overrides in another order name the same run."""
    items = [*schedule_items, *canonical_overrides(overrides)]
    if not items:
        return ""
    return "-v" + hashlib.sha256("".join(f"{item}\n" for item in items).encode()).hexdigest()[:8]
