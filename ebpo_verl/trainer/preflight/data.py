"""Pre-flight checks of the data: one reader of verl data files (:func:`read_data_file`), the driver's check of
every training and validation file (:func:`check_data`: steps per epoch, ground truths, curriculum labels), and
the row checks the trainer runs on its loaded dataset (the estimator's per-row labels or prompt keys)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.ops.errors import EBPOConfigError, one_line
from ebpo_verl.ops.model_ref import model_reference_problem
from ebpo_verl.ops.node_check import path_list
from ebpo_verl.options.parsing import is_missing
from ebpo_verl.trainer.run_options import RunOptions


@dataclass(frozen=True)
class DataFile:
    """The columns of a verl data file the pre-flight reads: the prompt, ``reward_model`` and ``extra_info``, one
    per row."""

    path: str
    rows: int
    reward_models: list[Any] | None  # None: the file has no reward_model column
    extra_infos: list[Mapping[str, Any]]
    prompts: list[Any] | None = None  # None: the file has no prompt column (data.prompt_key)


def read_data_file(path: str, key: str, prompt_key: str = "prompt") -> DataFile:
    """Read a verl data file as verl's ``RLHFDataset`` does (.parquet; .json as a list or as lines; .jsonl).

    ``key`` (``data.train_files``) names the setting in the errors: an unsupported format and an unreadable file
    are refused. ``prompt_key``: the prompt's column (``data.prompt_key``).
    """
    if not path.endswith((".parquet", ".json", ".jsonl")):
        raise EBPOConfigError(f"{key}: {path} has an unsupported format; verl reads .parquet, .json, .jsonl")
    wanted = ("reward_model", "extra_info", prompt_key)
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            table = pq.read_table(path, columns=[c for c in wanted if c in names])
            columns = {name: table.column(name).to_pylist() for name in table.column_names}
            rows = table.num_rows
        else:
            import pandas as pd

            text = Path(path).read_text(encoding="utf-8")
            as_list = path.endswith(".json") and text.lstrip().startswith("[")
            records = json.loads(text) if as_list else [json.loads(line) for line in text.splitlines() if line.strip()]
            frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
            columns = {c: frame[c].tolist() for c in wanted if c in frame.columns}
            rows = len(frame)
    except Exception as err:  # pyarrow / json raise their own types for a truncated or foreign file
        raise EBPOConfigError(f"{key}: {path} is not a readable verl data file ({one_line(err)})") from err
    infos = [info if isinstance(info, Mapping) else {} for info in columns.get("extra_info", [None] * rows)]
    return DataFile(path, rows, columns.get("reward_model"), infos, columns.get(prompt_key))


def check_model_path(config: Any, options: RunOptions, dry_run: bool) -> None:
    """``actor_rollout_ref.model.path`` names a local folder or a hub id, in a dry run too (the run would
    otherwise prepare and label its data before verl fails to load the model)."""
    value = str(config.actor_rollout_ref.model.path)
    if problem := model_reference_problem(value):
        raise EBPOConfigError(
            f"actor_rollout_ref.model.path={problem}; set MODEL_PATH (recipes) or actor_rollout_ref.model.path "
            "to a Hugging Face model folder or a hub id"
        )


def check_data(config: Any, options: RunOptions, dry_run: bool) -> str:
    """Every local training and validation file, each read once: at least one training step per epoch, a ground
    truth in every row, and the curriculum's label in the training rows. Returns the steps-per-epoch line.

    One epoch must fill one batch: the rows of ``data.train_files`` (capped at ``data.train_max_samples``, counted
    before verl's overlong-prompt filter) against ``data.gen_batch_size`` or ``data.train_batch_size`` (verl drops
    the last partial batch, so fewer rows train zero steps and exit 0). A missing local file raises, or with
    ``dry_run`` (``--cfg job`` on a machine without the data) is skipped, the line saying what was not checked;
    remote files (``hdfs://``) are not read.
    """
    train, val = path_list(config.data.get("train_files", None)), path_list(config.data.get("val_files", None))
    prompt_key = str(config.data.get("prompt_key", None) or "prompt")
    not_checked = None
    read: dict[str, list[DataFile]] = {"data.train_files": [], "data.val_files": []}
    for key, files in (("data.train_files", train), ("data.val_files", val)):
        for path in files:
            if "://" in path:
                not_checked = not_checked or (key == "data.train_files" and f"{path} is not a local file")
                continue
            if not os.path.isfile(path):
                if dry_run:
                    not_checked = not_checked or (
                        key == "data.train_files" and f"{path} does not exist on this machine"
                    )
                    continue
                fix = "prepare the data" + (" (python -m ebpo_verl.data.all)" if key == "data.train_files" else "")
                raise EBPOConfigError(f"{key}: {path} does not exist (or is not a file); {fix} or fix the path")
            read[key].append(read_data_file(path, key, prompt_key))
    line = f"steps per epoch not checked: data.train_files {not_checked}" if not_checked else None
    if line is None:
        line = _steps_per_epoch(config, read["data.train_files"])
    for key, data_files in read.items():
        for data in data_files:
            _check_rows(data, key, prompt_key)
    if read["data.train_files"] and len(read["data.train_files"]) == len(train):  # the labels need every row
        _check_curriculum_labels(options, read["data.train_files"])
    return line


def _steps_per_epoch(config: Any, files: list[DataFile]) -> str:
    batch_key = "data.gen_batch_size" if config.data.get("gen_batch_size", None) else "data.train_batch_size"
    batch = int(OmegaConf.select(config, batch_key))
    rows = sum(f.rows for f in files)
    cap = int(config.data.get("train_max_samples", -1) or -1)
    capped = f", capped by data.train_max_samples={cap}" if 0 < cap < rows else ""
    rows = min(rows, cap) if cap > 0 else rows
    detail = ", ".join(f"{f.path}: {f.rows} rows" for f in files) + capped
    if rows < batch:
        raise EBPOConfigError(
            f"one epoch would train 0 steps: data.train_files has {rows} rows ({detail}) but {batch_key}={batch} "
            f"(verl drops the last partial batch). Use a larger training file or {batch_key}<={rows}."
        )
    return f"{rows} training rows ({detail}; before verl's overlong-prompt filter) -> {rows // batch} steps per epoch"


def _check_rows(data: DataFile, key: str, prompt_key: str) -> None:
    """Every row's prompt is in verl's chat format and it has a ground truth
    (:func:`ebpo_verl.data.schema.check_chat_prompts`, :func:`~ebpo_verl.data.schema.check_ground_truths`)."""
    import pandas as pd

    from ebpo_verl.data.schema import DataPrepError, check_chat_prompts, check_ground_truths

    try:
        if data.prompts is None:
            raise EBPOConfigError(
                f"{key}: {data.path} has no {prompt_key!r} column (data.prompt_key={prompt_key}), which verl reads as "
                "each row's chat prompt; prepare the file with ebpo_verl.data, or set data.prompt_key to its prompt "
                "column"
            )
        check_chat_prompts(data.prompts, f"{key}: {data.path}", prompt_key)
        if data.reward_models is None:
            raise EBPOConfigError(
                f"{key}: {data.path} has no reward_model column (verl reads reward_model.ground_truth); prepare it "
                "with ebpo_verl.data or add the column"
            )
        check_ground_truths(pd.DataFrame({"reward_model": data.reward_models}), source=f"{key}: {data.path}")
    except DataPrepError as err:
        raise EBPOConfigError(str(err)) from err


def _check_curriculum_labels(options: RunOptions, files: list[DataFile]) -> None:
    from ebpo_verl.trainer.curriculum import difficulty_key

    infos = [info for f in files for info in f.extra_infos]
    order = options.curriculum.order
    if order not in ("topic", "difficulty"):
        return
    label = options.curriculum.topic_key if order == "topic" else difficulty_key(options.curriculum, infos)
    option = "topic_key" if order == "topic" else "difficulty_key"
    missing = [(f.path, row) for f in files for row, info in enumerate(f.extra_infos) if is_missing(info.get(label))]
    if not missing:
        return
    names = ", ".join(f.path for f in files)
    if len(missing) == len(infos):
        present = sorted({str(k) for info in infos for k, v in info.items() if not is_missing(v)})
        raise EBPOConfigError(
            f"data.curriculum.order={order} sorts by extra_info[{label!r}], but none of the {len(infos)} "
            f"training rows ({names}) has it; extra_info fields present: {present or 'none'}. Set "
            f"data.curriculum.{option} to the field that holds the label, or add it to the data."
        )
    if options.curriculum.missing == "error":
        path, row = missing[0]
        raise EBPOConfigError(
            f"data.curriculum.order={order}: row {row} (0-based) of {path} has no extra_info[{label!r}] "
            f"({len(missing)} of {len(infos)} training rows lack it). Fix the data, or set "
            "data.curriculum.missing=last to train those rows at the end of each epoch."
        )


def check_row_keys(extra_infos: Iterable[Mapping[str, Any] | None], options: RunOptions, source: str) -> None:
    """The training rows carry the field the estimator reads per row (:attr:`RunOptions.row_key`, named by its
    spec's ``row_option``): a prompt key unique over the rows (``unique_row_key``) or a label."""
    spec, key = options.spec, options.row_key
    if spec is not None and key:
        (check_prompt_keys if spec.unique_row_key else check_row_labels)(extra_infos, key, source, spec)


def _rows_of(
    extra_infos: Iterable[Mapping[str, Any] | None], key: str, source: str, option: str, fixes: tuple[str, str]
) -> dict[str, list[int]]:
    """The rows of each value of ``extra_info[key]`` (as a string), in row order; EBPOConfigError unless every row
    has it (missing or null), naming ``option`` and the fix (``fixes``: when no row has the key, when some rows
    lack it), with the keys the rows do have."""
    existing: set[str] = set()
    missing: list[int] = []
    rows_of: dict[str, list[int]] = {}
    for row, info in enumerate(extra_infos):
        info = info or {}
        existing.update(str(k) for k in info)
        if is_missing(value := info.get(key)):
            missing.append(row)
        else:
            rows_of.setdefault(str(value), []).append(row)
    if missing and key not in existing:
        raise EBPOConfigError(
            f"{option}={key!r} is not a key of extra_info in the training data ({source}); extra_info keys present: "
            f"{sorted(existing) or 'none'}. {fixes[0]}"
        )
    if missing:
        rows = len(missing) + sum(map(len, rows_of.values()))
        raise EBPOConfigError(
            f"extra_info[{key!r}] ({option}) is missing or null in {len(missing)} of {rows} training rows ({source}); "
            f"first rows: {missing[:10]}. {fixes[1]}"
        )
    return rows_of


def check_row_labels(
    extra_infos: Iterable[Mapping[str, Any] | None], key: str, source: str, spec: EstimatorSpec
) -> None:
    """Every training row carries ``extra_info[key]`` (not null), the label ``spec`` reads per row (its
    ``row_option``: EBPO's cluster, running_norm's domain); else list what the rows do have. ``source``: where the
    rows come from (the data files), for the message."""
    option = str(spec.row_option)
    off = f", or set {option}=null" if _takes_null(spec) else ""
    fix = f"Pick one of them, or add the labels to the data (ebpo_verl.data){off}."
    _rows_of(extra_infos, key, source, option, (fix, "Every prompt needs a label: fix the data (ebpo_verl.data)."))


def _takes_null(spec: EstimatorSpec) -> bool:
    """Whether the spec's row option accepts null (the estimator then reads no field)."""
    return any(None in f.metadata["choices"] for f in spec.options_cls.declarations() if f.name == spec.row_key)


def check_prompt_keys(
    extra_infos: Iterable[Mapping[str, Any] | None], prompt_key: str, source: str, spec: EstimatorSpec
) -> None:
    """A per-prompt tracker's key: every training row needs ``extra_info[prompt_key]`` (not null), unique over the
    rows (``spec``'s ``row_option`` names the setting, its state's label the estimator).

    verl's uid is drawn afresh every step, so the tracker refuses to fall back to it; a key shared by two rows
    would merge two prompts' trackers (several training files each number ``index`` from 0).
    """
    option, label = str(spec.row_option), spec.state.label if spec.state else spec.name
    fix = (
        f"{label} tracks each prompt across steps by this key (verl's uid changes every step): pick a field unique "
        "per prompt, or add one in ebpo_verl.data."
    )
    fixes = (fix, "Every prompt needs a key: fix the data.")
    rows_of = _rows_of(extra_infos, prompt_key, source, option, fixes)
    repeats = [(at[1], key, at[0]) for key, at in rows_of.items() if len(at) > 1]
    if repeats:
        b, key, a = min(repeats)  # the first row that repeats an earlier row's key
        raise EBPOConfigError(
            f"extra_info[{prompt_key!r}] ({option}) is not unique in the training data ({source}): "
            f"{sum(len(at) - 1 for at in rows_of.values())} row(s) repeat an earlier row's key (first: {key!r} at "
            f"rows {a} and {b}), which would merge their {label} trackers. Several training files each number "
            f"`index` from 0: set {option} to a field unique across them."
        )
