"""Where a preparer's rows come from: a local copy in the hub schema (a ``.jsonl``, ``.json`` or ``.parquet`` file,
or a dataset folder) or the pinned hub dataset; unreadable input is one :class:`DataPrepError` naming the file (and
line)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa


class DataPrepError(ValueError):
    """Bad input to a preparer (file, folder, schema, row); the command line prints it as one error line."""


LOCAL_SUFFIXES = (".parquet", ".jsonl", ".json")


def read_local(path: str | Path, split: str) -> pd.DataFrame:
    """A local copy in the hub schema: a ``.jsonl``, ``.json`` (records) or ``.parquet`` file, or a hub dataset folder
    (its ``split`` files, or its only split). Values keep their types; a pandas ``__index_level_0__`` is dropped.
    Unreadable input: :class:`DataPrepError` naming the file (and line, for JSON)."""
    path = Path(path)
    if path.is_dir():
        df = _read_folder(path, split)
    elif not path.is_file():
        raise DataPrepError(f"local copy {path} does not exist")
    elif path.suffix.lower() == ".parquet":
        try:
            df = pd.read_parquet(path)
        except (pa.ArrowException, OSError) as e:
            raise DataPrepError(f"{path} is not a readable parquet file (truncated or corrupt?): {e}") from None
    elif path.suffix.lower() == ".jsonl":
        df = pd.DataFrame([record for _, record in read_jsonl_records(path)])
    elif path.suffix.lower() == ".json":
        df = pd.DataFrame(_read_json(path))
    else:
        raise DataPrepError(
            f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or .parquet (or a dataset folder)"
        )
    return df.drop(columns=[c for c in df.columns if c.startswith("__index_level_")])


def _decode(raw: bytes, path: Path, first_line: int = 1) -> str:
    """``raw`` as UTF-8; DataPrepError naming the line (counted from ``first_line``) and column otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + raw.count(b"\n", 0, e.start)
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataPrepError(
            f"{path}, line {line}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte column {column}); "
            "re-save the file as UTF-8"
        ) from None


def read_jsonl_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank JSON-lines line; DataPrepError naming a line not UTF-8/JSON/an object."""
    path = Path(path)
    records = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = _decode(raw, path, number)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataPrepError(f"{path}, line {number}: not valid JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(record, dict):
                raise DataPrepError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
            records.append((number, record))
    return records


def _read_json(path: Path) -> list[dict[str, Any]] | dict[str, Any]:
    try:
        data = json.loads(_decode(path.read_bytes(), path))
    except json.JSONDecodeError as e:
        raise DataPrepError(f"{path}, line {e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    if isinstance(data, list) and all(isinstance(r, dict) for r in data) or isinstance(data, dict):
        return data
    raise DataPrepError(f"{path}: expected a list of JSON objects (one per row)")


def _read_folder(path: Path, split: str) -> pd.DataFrame:
    """The ``split`` files of a dataset folder (split from file names, as ``datasets`` infers it), concatenated."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    reason = f"no {', '.join(LOCAL_SUFFIXES)} files"
    try:
        found = DataFilesDict.from_patterns(get_data_patterns(str(path)), base_path=str(path))
    except FileNotFoundError as e:  # datasets' EmptyDatasetError
        found, reason = {}, str(e)
    splits = {str(k): sorted(f for f in v if Path(f).suffix.lower() in LOCAL_SUFFIXES) for k, v in found.items()}
    splits = {k: v for k, v in splits.items() if v}
    if not splits:
        raise DataPrepError(
            f"{path} is a folder without a dataset ({reason}); pass a .jsonl, .json or .parquet file, or a folder of "
            "such files"
        )
    if split not in splits and len(splits) != 1:
        raise DataPrepError(f"dataset folder {path} has splits {sorted(splits)} but no {split!r}; pass the file itself")
    files = splits.get(split) or next(iter(splits.values()))
    return pd.concat([read_local(f, split) for f in files], ignore_index=True)


HUB_TIMEOUT_S = 5.0


def check_hub(fix: str = "pass --local-dir DIR with the dataset files (docs/data.md)") -> None:
    """DataPrepError (one line ending in ``fix``) unless the hub answers within :data:`HUB_TIMEOUT_S` s (fail at once,
    not in ``datasets``' retries); skipped under ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1``."""
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise DataPrepError(f"the Hugging Face hub ({endpoint}) cannot be reached ({reason}): {fix}") from None


def load_hub(repo_id: str, split: str, config: str | None = None, revision: str | None = None) -> pd.DataFrame:
    """The hub copy via ``datasets`` (needs network access to huggingface.co)."""
    import datasets

    return datasets.load_dataset(repo_id, config, split=split, revision=revision).to_pandas()
