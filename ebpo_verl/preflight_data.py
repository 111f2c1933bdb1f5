"""Pre-flight checks that read verl's registry and the data files (part of :func:`ebpo_verl.validation.preflight`).

Each of these would otherwise fail only after Ray has started and a rollout has run, or not at all:

- :func:`check_estimator_name`: ``algorithm.adv_estimator`` is a name in verl's estimator registry once this
  package's estimators are registered (verl looks it up at the first advantage step);
- :func:`check_data_files`: every row of ``data.train_files`` and ``data.val_files`` has a ground truth (a None,
  NaN or empty one can never be scored), and a ``topic`` / ``difficulty`` curriculum finds its label in the
  training rows (:class:`~ebpo_verl.curriculum.CurriculumDataset` would refuse them in the TaskRunner).

Errors are :class:`~ebpo_verl.validation.EBPOConfigError` naming the setting, the file and the row.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ebpo_verl.ordering import FALLBACK_DIFFICULTY_KEY, PASS_RATE_KEY, CurriculumOptions, is_missing
from ebpo_verl.validation import EBPOConfigError


def check_estimator_name(config: Any) -> None:
    """``algorithm.adv_estimator`` must be registered in verl after ``ebpo_verl.register()``; else list the names."""
    from verl.trainer.ppo import core_algos

    import ebpo_verl

    ebpo_verl.register()
    name = str(config.algorithm.adv_estimator)
    known = sorted(core_algos.ADV_ESTIMATOR_REGISTRY)
    if name not in known:
        raise EBPOConfigError(
            f"algorithm.adv_estimator={name!r} is not an advantage estimator known to verl or ebpo-verl; "
            f"known: {', '.join(known)}"
        )


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [os.path.expanduser(str(item)) for item in items]


def _read_columns(path: str, key: str) -> tuple[list[Any], list[Any]]:
    """(``reward_model``, ``extra_info``) of every row of a verl data file (.parquet, .json, .jsonl)."""
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            table = pq.read_table(path, columns=[c for c in ("reward_model", "extra_info") if c in names])
            columns = {name: table.column(name).to_pylist() for name in table.column_names}
            rows = table.num_rows
        else:
            import pandas as pd

            frame = pd.read_json(path, lines=path.endswith(".jsonl"))
            columns = {c: frame[c].tolist() for c in ("reward_model", "extra_info") if c in frame.columns}
            rows = len(frame)
    except Exception as err:  # pyarrow / pandas raise their own types for a truncated or foreign file
        text = " ".join(str(err).split()) or type(err).__name__
        raise EBPOConfigError(f"{key}: {path} is not a readable verl data file ({text})") from err
    if "reward_model" not in columns:
        raise EBPOConfigError(
            f"{key}: {path} has no reward_model column (verl reads reward_model.ground_truth); prepare it with "
            "data_prep or add the column"
        )
    return columns["reward_model"], columns.get("extra_info", [None] * rows)


def _check_ground_truths(path: str, key: str, reward_models: list[Any]) -> None:
    import pandas as pd

    from data_prep.schema import DataPrepError, check_ground_truths

    try:
        check_ground_truths(pd.DataFrame({"reward_model": reward_models}), source=f"{key}: {path}")
    except DataPrepError as err:
        raise EBPOConfigError(str(err)) from err


def _curriculum_label(config: Any, infos: list[Mapping[str, Any]]) -> tuple[CurriculumOptions, str] | None:
    """The curriculum options and the ``extra_info`` field its order sorts by; None for native/random orders."""
    node = config.data.get("curriculum", None)  # a mapping or null: check_config ran before
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    try:
        options = CurriculumOptions.from_mapping(dict(node or {}))
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err
    if options.order == "topic":
        return options, options.topic_key
    if options.order == "difficulty":
        if options.difficulty_key is not None:
            return options, options.difficulty_key
        has_pass_rate = any(not is_missing(info.get(PASS_RATE_KEY)) for info in infos)
        return options, PASS_RATE_KEY if has_pass_rate else FALLBACK_DIFFICULTY_KEY
    return None


def _check_curriculum_labels(config: Any, per_file: list[tuple[str, list[Mapping[str, Any]]]]) -> None:
    infos = [info for _, rows in per_file for info in rows]
    found = _curriculum_label(config, infos)
    if found is None:
        return
    options, label = found
    option = "topic_key" if options.order == "topic" else "difficulty_key"
    missing = [(path, row) for path, rows in per_file for row, info in enumerate(rows) if is_missing(info.get(label))]
    if not missing:
        return
    files = ", ".join(path for path, _ in per_file)
    if len(missing) == len(infos):
        present = sorted({str(k) for info in infos for k, v in info.items() if not is_missing(v)})
        raise EBPOConfigError(
            f"data.curriculum.order={options.order} sorts by extra_info[{label!r}], but none of the {len(infos)} "
            f"training rows ({files}) has it; extra_info fields present: {present or 'none'}. Set "
            f"data.curriculum.{option} to the field that holds the label, or add it to the data."
        )
    if options.missing == "error":
        path, row = missing[0]
        raise EBPOConfigError(
            f"data.curriculum.order={options.order}: row {row} (0-based) of {path} has no extra_info[{label!r}] "
            f"({len(missing)} of {len(infos)} training rows lack it). Fix the data, or set "
            "data.curriculum.missing=last to train those rows at the end of each epoch."
        )


def check_data_files(config: Any, *, missing_ok: bool) -> None:
    """Ground truths of the training and validation rows, and the curriculum's label in the training rows.

    A file absent from this machine raises, or with ``missing_ok`` (``--cfg job`` elsewhere) is skipped (the
    steps-per-epoch line names an absent training file); remote files (``hdfs://``) are not read.
    """
    train_files = _files(config.data.get("train_files", None))
    per_file: list[tuple[str, list[Mapping[str, Any]]]] = []
    for key, files in (("data.train_files", train_files), ("data.val_files", _files(config.data.get("val_files")))):
        for path in files:
            if "://" in path or (missing_ok and not os.path.isfile(path)):
                continue
            if not os.path.isfile(path):
                raise EBPOConfigError(
                    f"{key}: {path} does not exist (or is not a file); prepare the data or fix the path"
                )
            reward_models, infos = _read_columns(path, key)
            _check_ground_truths(path, key, reward_models)
            if key == "data.train_files":
                per_file.append((path, [info if isinstance(info, Mapping) else {} for info in infos]))
    if per_file and len(per_file) == len(train_files):  # the label check needs every training row
        _check_curriculum_labels(config, per_file)
